"""Request arrival times of a load generator and the load lists of a sweep.

Poisson arrivals with vLLM's burstiness: gaps drawn from a gamma distribution of shape `burstiness` and mean 1/rate
(burstiness 1: exponential gaps, a Poisson process; < 1 burstier, > 1 more regular; constant gaps with
`--arrival constant`). A rate of inf sends everything at once (or, with a concurrency limit, a closed loop).
`--rate sweep[:N]` is guidellm's sweep profile: a synchronous load, a throughput load, then N - 2 rates between the
request rates those two measured. `--ramp-up-strategy` is vLLM's ramp-up: one load whose rate grows from a start rate
to an end rate over its requests."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

ARRIVALS = ("poisson", "constant")
# the largest gamma shape: its gaps are already constant to 3% (CV 1/sqrt(shape)); at 1e308 the gamma draw broke
MAX_BURSTINESS = 1000.0


@dataclass(frozen=True, slots=True)
class Load:
    """One point of a sweep: requests per second (inf: no pacing) and the most requests in flight (None: no cap)."""

    rate: float
    max_concurrency: int | None
    # a sweep's load: guidellm's strategy type (synchronous, throughput, constant, poisson), which names it
    strategy: str | None = None
    # a ramped load (rate: the ramp's end rate, the highest it sends at)
    ramp: Ramp | None = None

    @property
    def closed_loop(self) -> bool:
        """Unpaced with a cap: each finished request lets the next one start (time waiting for a slot is the
        load generator's own pacing, so it is not counted as queueing)."""
        return math.isinf(self.rate) and self.max_concurrency is not None

    @property
    def label(self) -> str:
        if self.ramp is not None:
            cap = "" if self.max_concurrency is None else f", conc {self.max_concurrency}"
            return self.ramp.label + cap
        if self.strategy in ("synchronous", "throughput"):
            return self.strategy
        if self.strategy is not None:  # guidellm's name, constant@2.35 (2 decimals hide a slow server's steps)
            return f"{self.strategy}@{self.rate:.2f}" if self.rate >= 0.1 else f"{self.strategy}@{self.rate:.2g}"
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


RAMPS = ("linear", "exponential")


def _positive_rate(flag: str, rate: float) -> None:
    # a rate so small that 1/rate is inf would wait forever, as --rate's (parse_rates)
    if not (rate > 0 and math.isfinite(rate) and math.isfinite(1 / rate)):
        raise ValueError(f"{flag} must be a finite number > 0 requests/s (got {rate:g})")


@dataclass(frozen=True, slots=True)
class Ramp:
    """vLLM bench serve's ramp-up (--ramp-up-strategy, its get_request): the rate grows from `start` to `end`
    requests/s over a load's `requests`, request by request: request i of n goes out at start + (end - start) * p
    (linear) or start * (end / start) ** p (exponential), p = i / (n - 1), the gap before it drawn at that rate. Being
    by request, not by time, it sends as many requests at each step of the rate (linear) or of its logarithm
    (exponential): every part of the range is measured by as many requests."""

    strategy: str
    start: float
    end: float
    requests: int

    @classmethod
    def parse(
        cls, strategy: str, start: float | None, end: float | None, requests: int | None, duration: float | None
    ) -> Ramp:
        """The ramp the flags ask for, over `requests` (--num-requests), else as many as span less than `duration`
        (--duration alone: the ramp ends as the load's time does). Anything it cannot run is refused, naming the
        flag."""
        if strategy not in RAMPS:
            raise ValueError(f"--ramp-up-strategy must be one of {', '.join(RAMPS)} (got {strategy!r})")
        if start is None or end is None:
            raise ValueError("--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps")
        if strategy == "exponential" and start == 0:
            raise ValueError("--ramp-up-start-rps must be above 0 for an exponential ramp: from 0 it stays at 0")
        _positive_rate("--ramp-up-start-rps", start)
        _positive_rate("--ramp-up-end-rps", end)
        if end <= start:
            raise ValueError(
                f"--ramp-up-end-rps must be above --ramp-up-start-rps (got {start:g} to {end:g}): the rate ramps up "
                "(one rate is --rate R)"
            )
        if requests is None:
            assert duration is not None, "a ramp spans --num-requests or --duration"
            if 1 / end >= duration:  # two requests: the one gap, at the end rate
                raise ValueError(
                    f"--duration {duration:g} s is too short for a ramp: even its first two requests, 1/{end:g} s "
                    "apart, do not fit"
                )
            return cls(strategy, start, end, _requests_within(strategy, start, end, duration))
        if requests < 2:
            raise ValueError(f"a ramp needs at least 2 requests, one at each end (got --num-requests {requests})")
        return cls(strategy, start, end, requests)

    def rate(self, i: int) -> float:
        """The rate request i goes out at (vLLM's _get_current_request_rate)."""
        progress = i / max(self.requests - 1, 1)
        if self.strategy == "linear":
            return self.start + (self.end - self.start) * progress
        return self.start * (self.end / self.start) ** progress

    def span(self) -> float:
        """Seconds from the first request to the last as planned: every gap at its mean, 1 / its rate."""
        return math.fsum(1 / self.rate(i) for i in range(1, self.requests))

    @property
    def label(self) -> str:
        return ramp_label(self.strategy, self.start, self.end)

    def as_dict(self) -> dict[str, Any]:
        """vLLM's result fields, and what it does not write: the requests the ramp is spread over (request i's rate
        is rate(i) of them) and the seconds it spans."""
        return {
            "ramp_up_strategy": self.strategy,
            "ramp_up_start_rps": self.start,
            "ramp_up_end_rps": self.end,
            "ramp_up_requests": self.requests,
            "ramp_up_span_s": self.span(),
        }


def ramp_label(strategy: str, start: float, end: float) -> str:
    """A ramped load's name (bench-compare names a vLLM ramp's file so too)."""
    return f"{strategy} ramp {start:g}->{end:g}"


def _requests_within(strategy: str, start: float, end: float, duration: float) -> int:
    """The most requests whose ramp spans less than `duration`. Its span over g gaps, the sum of 1/rate(i/g) for i = 1
    to g, grows with g and is about g times the integral of 1/rate over the ramp less half the first gap's excess over
    the last's (a right Riemann sum of a falling function); counted exactly from that estimate."""
    if strategy == "linear":
        integral = math.log(end / start) / (end - start)
    else:
        integral = (1 / start - 1 / end) / math.log(end / start)

    def fits(gaps: int) -> bool:
        return Ramp(strategy, start, end, gaps + 1).span() < duration

    # 1 gap fits (1/end < duration, checked before); no gap's mean is below 1/end, so `most` gaps do not. The estimate
    # is within a few of the count for most ramps, but far off for a start near 0 (its first gap's excess is huge:
    # 0.00001 -> 10 req/s over 60 s guessed 300,000 gaps of 114), so from it the count is bracketed by steps that
    # double, then bisected: a few spans, where stepping by one took as many spans as the guess was off.
    lo, hi = 1, max(2, math.ceil(duration * end))
    guess = min(max(1, int((duration + (1 / start - 1 / end) / 2) / integral)), hi)
    step = 1
    if fits(guess):
        lo = guess
        while lo + step < hi and fits(lo + step):
            lo, step = lo + step, step * 2
        hi = min(hi, lo + step)
    else:
        hi = guess
        while hi - step > lo and not fits(hi - step):
            hi, step = hi - step, step * 2
        lo = max(lo, hi - step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo + 1


# guidellm's default number of loads in a sweep (its --rate with --profile sweep)
SWEEP_LOADS = 10


def parse_sweep(text: str) -> int | None:
    """'sweep' -> 10 loads, 'sweep:N' -> N; None for a list of rates."""
    head, _, count = text.strip().lower().partition(":")
    if head != "sweep":
        if any(part.strip().lower().startswith("sweep") for part in text.split(",")):
            raise ValueError(f"--rate sweep plans loads of its own: give it alone, not in a list (got {text!r})")
        return None
    try:
        n = int(count) if count else SWEEP_LOADS
    except ValueError:
        raise ValueError(f"--rate sweep:N takes a whole number of loads (got {count!r})") from None
    if n < 3:
        raise ValueError(
            f"--rate sweep:N needs N >= 3: the synchronous load, the throughput load and at least one rate between "
            f"them (got {n})"
        )
    return n


def sweep_rates(synchronous: float, throughput: float, loads: int) -> list[float]:
    """The rates of a sweep's loads after its first two, as guidellm's numpy.linspace(synchronous, throughput,
    loads - 1)[1:]: evenly spaced, one step above the synchronous rate up to the throughput rate itself."""
    step = (throughput - synchronous) / (loads - 2)
    return [synchronous + k * step for k in range(1, loads - 2)] + [throughput]


@dataclass(slots=True)
class Sweep:
    """--rate sweep[:N], guidellm's sweep profile: a synchronous load (one request at a time), a throughput load (all
    at once, or `cap` in flight), then N - 2 loads at rates (arrivals as `arrival`) spaced between the request rates
    those two measured. The first two are known up front; the rest once those have run."""

    loads: int
    arrival: str
    cap: int | None
    synchronous_rate: float | None = None
    throughput_rate: float | None = None
    rates: list[float] = field(default_factory=list)

    def first_loads(self) -> list[Load]:
        return [Load(math.inf, 1, "synchronous"), Load(math.inf, self.cap, "throughput")]

    def next_loads(self, rows: list[dict[str, Any]]) -> list[Load]:
        """The rate loads, from the first two rows' measured request rates (completed requests / duration)."""
        self.synchronous_rate, self.throughput_rate = rows[0]["request_throughput"], rows[1]["request_throughput"]
        self.rates = sweep_rates(self.synchronous_rate, self.throughput_rate, self.loads)
        return [Load(r, self.cap, self.arrival) for r in self.rates]

    def measured(self, rows: list[dict[str, Any]]) -> None:
        """The rates of those of the two measured loads that ran whole, for a sweep stopped before its rate loads (a
        load cut short measured no rate: it stays None)."""
        for row, attr in zip(rows, ("synchronous_rate", "throughput_rate")):
            if row.get("stop_reason") is None:
                setattr(self, attr, row["request_throughput"])

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": "sweep",
            "loads": self.loads,
            "rate_type": self.arrival,
            "max_concurrency": self.cap,
            "synchronous_rate": self.synchronous_rate,
            "throughput_rate": self.throughput_rate,
            "rates": self.rates,
            "derivation": "the synchronous and throughput loads' request_throughput; rates = "
            "linspace(synchronous_rate, throughput_rate, loads - 1)[1:], as guidellm's sweep",
        }


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
    n: int,
    rate: float,
    burstiness: float = 1.0,
    kind: str = "poisson",
    seed: int = 0,
    duration: float | None = None,
    ramp: Ramp | None = None,
) -> list[float]:
    """Send offsets in seconds (the first at 0) of at most n requests, and only those before `duration`. Gamma gaps
    are scaled so that the n requests span (n - 1) / rate, as vLLM's bench serve scales its delays to n / rate: the
    run sends at the rate asked for, not at a draw's (20 requests at --rate 8 went out at 6.6/s).

    With a `ramp` (of n requests; `rate` unused), the gap before request i is drawn at the ramp's rate for it, as
    vLLM's get_request draws it, and gamma gaps are scaled to the ramp's planned span (vLLM leaves a ramp's unscaled:
    a slow draw's last requests, the fastest, would fall past a --duration)."""
    if kind not in ARRIVALS:
        raise ValueError(f"--arrival must be one of {', '.join(ARRIVALS)} (got {kind!r})")
    if ramp is None:
        check_gaps(rate, burstiness)
        if math.isinf(rate):
            return [0.0] * n
    else:
        assert n == ramp.requests, "a ramp is drawn over its own requests"
        check_gaps(ramp.start, burstiness)  # the gamma scale is monotonic in the rate: its two ends bound it
        check_gaps(ramp.end, burstiness)
    rng = random.Random(seed)
    times, t = [], 0.0
    for i in range(n):
        if i:
            r = rate if ramp is None else ramp.rate(i)
            t += 1.0 / r if kind == "constant" else rng.gammavariate(burstiness, 1.0 / (r * burstiness))
        times.append(t)
    if kind != "constant" and n > 1 and times[-1] > 0:
        scale = ((n - 1) / rate if ramp is None else ramp.span()) / times[-1]
        times = [x * scale for x in times]
    return times if duration is None else [x for x in times if x < duration]
