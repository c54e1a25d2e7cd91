"""Per-request sampling settings, validated at construction so bad values never reach the engine."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 1.0  # 0 means greedy
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        checks = [
            (isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", "must be an integer >= 1"),
            (self.temperature >= 0, "temperature", "must be >= 0"),
            (
                isinstance(self.top_k, int) and -1 <= self.top_k < 2**63,
                "top_k",
                "must be -1 (off) or a positive 64-bit integer",
            ),
            (0 < self.top_p <= 1, "top_p", "must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p", "must be in [0, 1]"),
            # far below 1e-6, dividing fp32 logits by it overflows to inf and every draw turns into NaN noise
            (self.repetition_penalty >= 1e-6, "repetition_penalty", "must be >= 1e-6"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty", "must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty", "must be in [-2, 2]"),
            (
                self.seed is None or (isinstance(self.seed, int) and -(2**63) <= self.seed < 2**64),
                "seed",
                "must be a 64-bit integer",
            ),  # torch.Generator.manual_seed range; beyond it the sampler would raise
            (all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings"),
            (
                all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
                "stop_token_ids",
                "must be non-negative integers",
            ),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"{name} {why} (got {getattr(self, name)!r})")

    @property
    def greedy(self) -> bool:
        # Below 1e-5 a temperature is greedy in effect; far below, dividing fp32 logits by it overflowed to
        # inf/NaN and sampled token 0 every time.
        return self.temperature < 1e-5 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0 or self.frequency_penalty != 0
