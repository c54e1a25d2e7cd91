"""How long a step takes, learnt from the engine's own steps, so that a mixed step's prefill share can be sized to a
time target (`--mixed-step-ms`) instead of a token count.

Under load every decode step reads all running requests' KV, so its time grows with their context, and each prefill
token adds to it (docs/scheduling.md: on the H200 the replay's steps fit ~2.3 ms + ~1.7 ms per 100 k tokens of
context + ~6 ms per 1 k prefill tokens). A fixed chunk (1,024 tokens) is too much where the context is large (the
step every stream waits on passes the target) and too little where it is small (a prompt waits more steps than it
needs). The fit is a least-squares line through the last `window` steps, refitted every `refit` steps."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class StepTimeFit:
    target_s: float  # a mixed step's predicted time, prefill included
    min_tokens: int = 128  # a step's prefill share never falls below this: a waiting prompt always moves
    window: int = 512
    refit: int = 16
    min_steps: int = 64  # the fit is used once the window holds this many steps with prefill and as many without
    steps: deque[tuple[float, float, float]] = field(default_factory=deque)  # (KV tokens, prefill tokens, seconds)
    coef: tuple[float, float, float] | None = None  # seconds: per step, per KV token, per prefill token
    since_fit: int = 0

    def observe(self, kv_tokens: int, prefill_tokens: int, seconds: float) -> None:
        """One step: the context its decode rows read, the prefill tokens it carried, and how long it took."""
        self.steps.append((float(kv_tokens), float(prefill_tokens), seconds))
        if len(self.steps) > self.window:
            self.steps.popleft()
        self.since_fit += 1
        if self.since_fit >= self.refit:
            self.since_fit = 0
            self.coef = self._fit()

    def _fit(self) -> tuple[float, float, float] | None:
        data = np.asarray(self.steps)
        mixed = int((data[:, 1] > 0).sum())
        if min(mixed, len(data) - mixed) < self.min_steps:
            return None  # the prefill tokens' cost cannot be told apart from the rest yet
        x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
        a, b, c = np.linalg.lstsq(x, data[:, 2], rcond=None)[0]
        return (float(a), float(b), float(c)) if c > 0 else None

    def prefill_budget(self, kv_tokens: int, fallback: int, most: int) -> int:
        """Prefill tokens that keep a step over `kv_tokens` of context within the target: at least min_tokens, at most
        `most`; `fallback` while there is no usable fit."""
        if self.coef is None:
            return fallback
        a, b, c = self.coef
        room = (self.target_s - a - b * kv_tokens) / c
        return int(min(most, max(self.min_tokens, room)))
