"""Log-probabilities as the engine reports them: one record per token, plain data (no torch) so it crosses the
engine/front-end pipe and reaches every front end the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The model's log-probability of `token` at its position, and the `top` most likely tokens there as
    (token id, log-probability), best first (as many as the request asked for; `token` may be among them)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def to_wire(self) -> list[Any]:
        return [self.token, self.logprob, [t for t, _ in self.top], [lp for _, lp in self.top]]

    @staticmethod
    def from_wire(w: list[Any]) -> TokenLogprob:
        return TokenLogprob(w[0], w[1], tuple(zip(w[2], w[3])))
