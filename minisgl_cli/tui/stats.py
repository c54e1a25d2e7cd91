"""Numbers the chat shows: the server or engine load behind the KV/scheduler panel (`Load`), and rows of one turn's
and the load's figures for /stats and the plain mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from minisgl_cli.tui.session import setting_text

if TYPE_CHECKING:
    from engine.metrics import EngineMetrics
    from minisgl_cli.tui.session import ChatSession
    from minisgl_cli.tui.turn import TurnStats


@dataclass(frozen=True, slots=True)
class Load:
    """KV cache and scheduler state, from the in-process engine or a server's /metrics. A server exposes only some
    of these (None: not exposed); SGLang counts its KV in tokens, which shows here as pages of 1 token."""

    source: str  # engine | minisgl | vllm | sglang
    kv_usage: float | None = None  # fraction of the KV pool in use by running requests
    kv_pages_in_use: int | None = None
    kv_pages_cached: int | None = None  # evictable: held only by the prefix cache
    kv_pages_free: int | None = None
    kv_pages_total: int | None = None
    page_size: int | None = None
    running: int | None = None
    waiting: int | None = None
    finished_requests: int | None = None
    preemptions: int | None = None
    prompt_tokens: int | None = None
    cache_hit_tokens: int | None = None
    generation_tokens: int | None = None
    cache_hit_rate: float | None = None
    steps: int | None = None
    stale: bool = False  # the last figures, kept while the engine is busy with a step longer than a read waits

    @classmethod
    def from_engine(cls, m: EngineMetrics) -> Load:
        return cls(
            "engine",
            m.kv_usage,
            m.kv_pages_in_use,
            m.kv_pages_cached,
            m.kv_pages_free,
            m.kv_pages_total,
            m.page_size,
            m.running,
            m.waiting,
            m.finished_requests,
            m.preemptions,
            m.prompt_tokens,
            m.cache_hit_tokens,
            m.generation_tokens,
            m.cache_hit_rate,
            m.steps,
        )


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _known(value: object, text: str) -> str:
    return "-" if value is None else text


def settings_rows(session: ChatSession) -> list[tuple[str, str]]:
    """What the next turn is sent with: typing `/system` to see the system prompt cleared it."""
    system = session.system or "(none)"
    thinking = {None: "the template's default", True: "on", False: "off"}[session.thinking]
    return [
        ("system prompt", system if len(system) <= 200 else system[:199] + "…"),
        ("temperature", f"{session.temperature:g}"),
        ("max tokens", str(session.max_tokens)),
        *[(name, setting_text(value)) for name, value in session.sampling.items()],  # as /set and exports name it
        ("thinking", thinking),
    ]


def turn_rows(turn: TurnStats) -> list[tuple[str, str]]:
    thinking = f" ({turn.reasoning_tokens} thinking)" if turn.reasoning_tokens else ""
    return [
        ("TTFT", ms(turn.ttft)),
        ("TBT p50 / p90", f"{ms(turn.tbt_p50)} / {ms(turn.tbt_p90)}"),
        ("decode", f"{turn.decode_tps:.1f} tok/s"),
        # no prompt has 0 tokens: 0 is not known yet (a server's usage comes with its last chunk, none if stopped)
        ("tokens", f"{turn.prompt_tokens or '-'} prompt, {turn.output_tokens} out{thinking}"),
        ("cache hit", f"{turn.cache_hit_tokens} / {turn.prompt_tokens} prompt tokens" if turn.prompt_tokens else "-"),
    ]


def load_rows(m: Load) -> list[tuple[str, str]]:
    rows = [("source", m.source)]
    if m.kv_pages_total is not None:
        unit = "tokens" if m.source == "sglang" else "KV pages"
        each = f" ({m.page_size} tokens each)" if m.page_size and m.source != "sglang" else ""
        rows.append(
            (
                unit,
                f"{m.kv_pages_in_use} in use, {_known(m.kv_pages_cached, f'{m.kv_pages_cached} cached, ')}"
                f"{_known(m.kv_pages_free, f'{m.kv_pages_free} free ')}of {m.kv_pages_total}{each}",
            )
        )
    if m.kv_usage is not None:
        rows.append(("KV usage", f"{m.kv_usage:.1%}"))
    rows.append(
        (
            "requests",
            f"{_known(m.running, str(m.running))} running, {_known(m.waiting, str(m.waiting))} waiting, "
            f"{_known(m.finished_requests, str(m.finished_requests))} finished",
        )
    )
    if m.prompt_tokens is not None:
        hit = (
            f" ({m.cache_hit_tokens} from cache, {m.cache_hit_rate:.0%})"
            if m.cache_hit_tokens is not None and m.cache_hit_rate is not None
            else ""
        )
        rows.append(
            (
                "tokens",
                f"{m.prompt_tokens} prompt{hit}, {_known(m.generation_tokens, str(m.generation_tokens))} generated",
            )
        )
    elif m.cache_hit_rate is not None:
        rows.append(("cache hit rate", f"{m.cache_hit_rate:.0%}"))
    if m.steps is not None:
        rows.append(("steps", f"{m.steps} ({m.preemptions} preemptions)"))
    elif m.preemptions is not None:
        rows.append(("preemptions", str(m.preemptions)))
    return rows
