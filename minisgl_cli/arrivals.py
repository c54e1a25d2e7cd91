"""Request arrival times of a load generator and the load lists of a sweep.

Poisson arrivals with vLLM's burstiness: gaps drawn from a gamma distribution of shape `burstiness` and mean 1/rate
(burstiness 1: exponential gaps, a Poisson process; < 1 burstier, > 1 more regular; constant gaps with
`--arrival constant`). A rate of inf sends everything at once (or, with a concurrency limit, a closed loop)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

ARRIVALS = ("poisson", "constant")
# the largest gamma shape: its gaps are already constant to 3% (CV 1/sqrt(shape)); at 1e308 the gamma draw broke
MAX_BURSTINESS = 1000.0


@dataclass(frozen=True, slots=True)
class Load:
    """One point of a sweep: requests per second (inf: no pacing) and the most requests in flight (None: no cap)."""

    rate: float
    max_concurrency: int | None

    @property
    def closed_loop(self) -> bool:
        """Unpaced with a cap: each finished request lets the next one start (time waiting for a slot is the
        load generator's own pacing, so it is not counted as queueing)."""
        return math.isinf(self.rate) and self.max_concurrency is not None

    @property
    def label(self) -> str:
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        if self.max_concurrency is None:
            return f"rate {rate}"
        return (
            f"concurrency {self.max_concurrency}"
            if math.isinf(self.rate)
            else f"rate {rate}, conc {self.max_concurrency}"
        )


def parse_rates(text: str) -> list[float]:
    """'1,2,4,inf' -> [1.0, 2.0, 4.0, inf]; every rate must be > 0."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("inf", "infinity"):
            out.append(math.inf)
            continue
        try:
            r = float(part)
        except ValueError:
            raise ValueError(f"--rate takes numbers or inf separated by commas (got {part!r})") from None
        # a number past float's range reads as inf (no pacing) and one so small that 1/rate is inf waits forever
        if not r > 0 or not math.isfinite(r) or not math.isfinite(1 / r):
            raise ValueError(f"--rate must be a finite number > 0 requests/s, or inf for no pacing (got {part!r})")
        out.append(r)
    return out


def parse_concurrency(text: str) -> list[int]:
    """'1,8,64' -> [1, 8, 64]; every value must be >= 1."""
    out = []
    for part in text.split(","):
        try:
            c = int(part.strip())
        except ValueError:
            raise ValueError(f"--max-concurrency takes integers separated by commas (got {part.strip()!r})") from None
        if c < 1:
            raise ValueError(f"--max-concurrency must be >= 1 (got {c})")
        out.append(c)
    return out


def check_gaps(rate: float, burstiness: float) -> None:
    """Refuse a rate and gamma shape whose gaps a float cannot draw: random.gammavariate needs a finite shape and a
    finite scale 1/(rate * burstiness) > 0 (at --rate 1e306 --burstiness 1000 the product is inf, the scale 0)."""
    if not 0 < burstiness <= MAX_BURSTINESS:
        raise ValueError(f"--burstiness must be > 0 and at most {MAX_BURSTINESS:g} (got {burstiness:g})")
    if math.isinf(rate):
        return
    inv_scale = rate * burstiness
    if not (rate > 0 and math.isfinite(1 / rate) and 0 < inv_scale < math.inf and math.isfinite(1 / inv_scale)):
        why = "the gaps' gamma scale 1/(rate * burstiness) is no finite number > 0"
        raise ValueError(f"--rate {rate:g} with --burstiness {burstiness:g}: {why}")


def arrival_times(
    n: int, rate: float, burstiness: float = 1.0, kind: str = "poisson", seed: int = 0, duration: float | None = None
) -> list[float]:
    """Send offsets in seconds (the first at 0) of at most n requests, and only those before `duration`. Gamma gaps
    are scaled so that the n requests span (n - 1) / rate, as vLLM's bench serve scales its delays to n / rate: the
    run sends at the rate asked for, not at a draw's (20 requests at --rate 8 went out at 6.6/s)."""
    if kind not in ARRIVALS:
        raise ValueError(f"--arrival must be one of {', '.join(ARRIVALS)} (got {kind!r})")
    check_gaps(rate, burstiness)
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += 1.0 / rate if kind == "constant" else rng.gammavariate(burstiness, theta)
    if kind != "constant" and n > 1 and times[-1] > 0:
        scale = (n - 1) / rate / times[-1]
        times = [x * scale for x in times]
    return times if duration is None else [x for x in times if x < duration]
