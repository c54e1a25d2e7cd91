"""One chat conversation: its settings and the message history sent through the model's chat template."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams

Message = dict[str, str]
MAX_TEMPERATURE = 2.0


@dataclass(slots=True)
class ChatSession:
    system: str | None = None
    temperature: float = 0.7
    max_tokens: int = 512
    max_tokens_limit: int | None = None  # the model's context length, when known
    history: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.set_temperature(self.temperature)
        self.set_max_tokens(self.max_tokens)

    def set_temperature(self, value: float) -> None:
        if not (math.isfinite(value) and 0 <= value <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}] (got {value!r})")
        self.temperature = value

    def set_max_tokens(self, value: int) -> None:
        limit = self.max_tokens_limit
        if value < 1 or (limit is not None and value >= limit):
            top = f" and below the model's context of {limit}" if limit is not None else ""
            raise ValueError(f"max_tokens must be >= 1{top} (got {value})")
        self.max_tokens = value

    def messages(self, user_text: str) -> list[Message]:
        """What the next turn sends: system prompt, the conversation so far, the new user message."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.history + [{"role": "user", "content": user_text}]

    def params(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature)

    def commit(self, user_text: str, reply: str) -> None:
        self.history += [{"role": "user", "content": user_text}, {"role": "assistant", "content": reply}]

    def reset(self) -> None:
        self.history.clear()

    @property
    def turns(self) -> int:
        return len(self.history) // 2
