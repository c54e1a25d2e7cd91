"""A point-in-time view of the engine for front ends (TUI panel, /metrics, benchmarks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    running: int
    waiting: int
    kv_pages_total: int
    kv_pages_in_use: int
    kv_pages_cached: int  # evictable: held by the radix cache, no live request uses them
    kv_pages_free: int
    page_size: int
    prompt_tokens: int  # cumulative prompt tokens admitted
    cache_hit_tokens: int  # cumulative prompt tokens served from the radix cache
    generation_tokens: int
    finished_requests: int
    preemptions: int
    steps: int
    mixed_steps: int = 0  # steps that carried decode tokens and prefill chunks together

    @property
    def kv_usage(self) -> float:
        return self.kv_pages_in_use / max(self.kv_pages_total, 1)

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hit_tokens / max(self.prompt_tokens, 1)

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        d.update(kv_usage=self.kv_usage, cache_hit_rate=self.cache_hit_rate)
        return d
