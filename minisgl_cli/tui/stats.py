"""Numbers the chat shows: one turn's latency figures (from its RequestOutput) and engine-wide rows for /stats."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.llm import RequestOutput
from engine.metrics import EngineMetrics


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


@dataclass(slots=True)
class TurnStats:
    prompt_tokens: int = 0
    cache_hit_tokens: int = 0
    output_tokens: int = 0
    ttft: float | None = None  # seconds
    itls: list[float] = field(default_factory=list)  # inter-token gaps (TBT), seconds
    decode_seconds: float = 0.0  # first token to last token
    finish_reason: str | None = None

    @classmethod
    def from_output(cls, out: RequestOutput) -> TurnStats:
        t = out.token_times
        return cls(
            len(out.prompt_token_ids),
            out.cache_hit_tokens,
            len(out.token_ids),
            out.ttft,
            out.itls,
            t[-1] - t[0] if len(t) > 1 else 0.0,
            out.finish_reason,
        )

    @property
    def decode_tps(self) -> float:
        return (self.output_tokens - 1) / self.decode_seconds if self.decode_seconds > 0 else 0.0


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def turn_rows(turn: TurnStats) -> list[tuple[str, str]]:
    return [
        ("TTFT", ms(turn.ttft)),
        ("TBT p50 / p90", f"{ms(percentile(turn.itls, 50))} / {ms(percentile(turn.itls, 90))}"),
        ("decode", f"{turn.decode_tps:.1f} tok/s"),
        ("tokens", f"{turn.prompt_tokens} prompt, {turn.output_tokens} out"),
        ("cache hit", f"{turn.cache_hit_tokens} / {turn.prompt_tokens} prompt tokens"),
    ]


def engine_rows(m: EngineMetrics) -> list[tuple[str, str]]:
    return [
        (
            "KV pages",
            f"{m.kv_pages_in_use} in use, {m.kv_pages_cached} cached, {m.kv_pages_free} free "
            f"of {m.kv_pages_total} ({m.page_size} tokens each)",
        ),
        ("KV usage", f"{m.kv_usage:.1%}"),
        ("requests", f"{m.running} running, {m.waiting} waiting, {m.finished_requests} finished"),
        (
            "tokens",
            f"{m.prompt_tokens} prompt ({m.cache_hit_tokens} from cache, {m.cache_hit_rate:.0%}), "
            f"{m.generation_tokens} generated",
        ),
        ("steps", f"{m.steps} ({m.preemptions} preemptions)"),
    ]
