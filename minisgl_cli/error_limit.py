"""bench-serve's --max-errors: a load stops once too many of its requests have failed, so a broken or overloaded
server does not take a whole sweep's time. guidellm's constraints, per load as guidellm's are per benchmark: a count
(its max_errors) or a fraction of the requests ended (its max_global_error_rate, judged only once enough requests
have ended that a share means something)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minisgl_cli.replay import RequestResult

# guidellm's constraint_error_min_processed: a load's first few requests say little about its error rate (one failure
# among the first two is 50%)
RATE_JUDGED_FROM = 30

WHAT = "a count of failed requests (a whole number >= 1) or a share of the requests ended (a number between 0 and 1)"


@dataclass(frozen=True, slots=True)
class ErrorLimit:
    """Reached once `count` requests of a load have failed, or once the failed share of its ended requests (completed
    or failed) is at least `fraction`, from RATE_JUDGED_FROM ended requests on. One of the two is set."""

    count: int | None = None
    fraction: float | None = None

    @classmethod
    def parse(cls, text: str) -> ErrorLimit:
        """'5' -> 5 failed requests; '0.1' -> 10% of those ended. A whole number is a count ('1.0' too), a number
        strictly between 0 and 1 a share; anything else is refused (a share of 1.5 means nothing, a count of 1.5
        neither)."""
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"takes {WHAT} (got {text!r})") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"takes {WHAT} (got {text!r})")
        if value < 1:
            return cls(fraction=value)
        if value != int(value):
            raise ValueError(
                f"above 1 is a count of failed requests, a whole number; a share is below 1 (got {text!r})"
            )
        return cls(count=int(value))

    @property
    def value(self) -> int | float:
        return self.count if self.count is not None else self.fraction  # type: ignore[return-value]  # one is set

    def __str__(self) -> str:
        return f"{self.value:g}"

    def reached(self, failed: int, ended: int) -> bool:
        if self.count is not None:
            return failed >= self.count
        return ended >= RATE_JUDGED_FROM and failed / ended >= self.value

    def never_reached(self, requests: int) -> str | None:
        """Why a load of at most `requests` requests can never reach the limit (None: it can): a limit accepted and
        never applied would look as if it had guarded the run."""
        if self.count is not None and self.count > requests:
            return f"counts {self.count} failed requests, and each load sends at most {requests}"
        if self.fraction is not None and requests < RATE_JUDGED_FROM:
            return (
                f"{self} judges the share of failed requests once {RATE_JUDGED_FROM} of a load's have ended (as "
                f"guidellm), and each load sends at most {requests}: give a count"
            )
        return None


@dataclass(slots=True)
class ErrorTally:
    """One load's requests against the limit as they end: `replay.drive`'s `until`, True from the request that
    reaches it on."""

    limit: ErrorLimit
    failed: int = 0
    ended: int = 0
    reached: bool = False

    def __call__(self, res: RequestResult) -> bool:
        self.ended += 1
        self.failed += not res.ok
        self.reached = self.reached or self.limit.reached(self.failed, self.ended)
        return self.reached
