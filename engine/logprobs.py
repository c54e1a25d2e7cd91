"""Log-probabilities as the engine reports them: one record per token, plain data (no torch) so it crosses the
engine/front-end pipe and reaches every front end the same way."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The model's log-probability of `token` at its position, its rank there (1: the most likely; as vLLM counts it,
    the tokens at least as likely, itself included), and the `top` most likely tokens there as (token id,
    log-probability), best first (as many as the request asked for; `token` may be among them)."""

    token: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()

    def to_wire(self) -> list[Any]:
        return [self.token, self.logprob, self.rank, [t for t, _ in self.top], [lp for _, lp in self.top]]

    @staticmethod
    def from_wire(w: list[Any]) -> TokenLogprob:
        return TokenLogprob(w[0], w[1], w[2], tuple(zip(w[3], w[4])))


@dataclass(frozen=True, slots=True)
class Logprob:
    """vLLM's per-token record (vllm.logprobs.Logprob), for `RequestOutput.outputs`: a position's logprobs are a
    dict {token id: Logprob}, the chosen token first, then the top ones ranked 1, 2, ..."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def vllm_logprobs(
    records: Sequence[TokenLogprob], token_texts: Callable[[list[int]], list[str]] | None
) -> list[dict[int, Logprob]]:
    """TokenLogprob records in vLLM's shape; token_texts None: no decoded_token (vLLM's detokenize=False)."""
    ids = sorted({t for r in records for t in (r.token, *(t for t, _ in r.top))})
    text = dict(zip(ids, token_texts(ids))) if token_texts is not None and ids else {}
    out = []
    for r in records:
        entry = {r.token: Logprob(r.logprob, r.rank, text.get(r.token))}
        for rank, (t, lp) in enumerate(r.top, start=1):
            entry.setdefault(t, Logprob(lp, rank, text.get(t)))
        out.append(entry)
    return out
