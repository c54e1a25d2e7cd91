"""The chat's widgets: message bubbles, the live metrics panel (TTFT, TBT sparkline, KV-cache bar), and an
input box with history."""

from __future__ import annotations

from collections import deque

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Input, Markdown, Sparkline, Static

from engine.metrics import EngineMetrics
from minisgl_cli.tui.stats import TurnStats, ms, percentile


def _rows(rows: list[tuple[str, str]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { background: $boost; border-left: thick $accent; padding: 0 1; margin: 1 0 0 0; }
    """

    def __init__(self, text: str) -> None:
        super().__init__(Text(text))


class AssistantMessage(Markdown):
    DEFAULT_CSS = """
    AssistantMessage { border-left: thick $success; padding: 0 1; margin: 1 0 0 0; }
    AssistantMessage.-stopped { border-left: thick $warning; }
    AssistantMessage.-error { border-left: thick $error; }
    AssistantMessage MarkdownBlock:last-child { margin-bottom: 0; }
    """


class NoteMessage(Static):
    """Help, /stats output and other messages from the app itself (never sent to the model):
    titled sections of (key, value) rows."""

    DEFAULT_CSS = """
    NoteMessage { border-left: thick $secondary; padding: 0 1; margin: 1 0 0 0; }
    """

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]]) -> None:
        self.sections = sections
        parts: list[Text | Table] = []
        for title, rows in sections:
            parts += [Text(title, style="bold"), _rows(rows)]
        super().__init__(Group(*parts))


def kv_bar(m: EngineMetrics, width: int) -> Text:
    """Pages in use (solid), cached/evictable (shaded), free (light), in proportion to the pool."""
    total = max(m.kv_pages_total, 1)
    used = round(width * m.kv_pages_in_use / total)
    cached = round(width * m.kv_pages_cached / total)
    if m.kv_pages_in_use and not used:
        used = 1  # any page in use shows as at least one cell
    if m.kv_pages_cached and not cached:
        cached = 1
    cached = min(cached, width - used)
    return Text.assemble(
        ("█" * used, "bold green"), ("▓" * cached, "yellow"), ("░" * (width - used - cached), "grey50")
    )


class MetricsPanel(VerticalScroll):
    """Live numbers: the last turn (TTFT, TBT, tok/s, cache hits) and the engine (KV pages, requests)."""

    DEFAULT_CSS = """
    MetricsPanel { width: 40; border-left: solid $primary; padding: 0 1; }
    MetricsPanel .title { text-style: bold; color: $accent; margin: 1 0 0 0; }
    MetricsPanel Sparkline { height: 3; margin: 0 0 0 0; }
    """
    WINDOW = 120  # recent tokens in the TBT sparkline and its percentiles

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.tbt_ms: deque[float] = deque(maxlen=self.WINDOW)
        self.turn = TurnStats()
        self.engine_metrics: EngineMetrics | None = None
        self._turn_itls = 0  # gaps of the current turn already in the window

    def compose(self) -> ComposeResult:
        yield Static("Last turn", classes="title")
        yield Static(id="turn")
        yield Static(f"TBT, last {self.WINDOW} tokens", classes="title")
        yield Static(id="tbt")
        yield Sparkline([], id="tbt-spark")
        yield Static("KV cache", classes="title")
        yield Static(id="kv")
        yield Static("Scheduler", classes="title")
        yield Static(id="sched")

    def on_mount(self) -> None:
        self.show_turn(self.turn)

    def new_turn(self) -> None:
        self._turn_itls = 0

    def show_turn(self, turn: TurnStats) -> None:
        self.turn = turn
        self.tbt_ms.extend(g * 1e3 for g in turn.itls[self._turn_itls :])
        self._turn_itls = len(turn.itls)
        self.query_one("#turn", Static).update(
            _rows(
                [
                    ("TTFT", ms(turn.ttft)),
                    ("decode", f"{turn.decode_tps:.1f} tok/s"),
                    ("tokens", f"{turn.prompt_tokens} in / {turn.output_tokens} out"),
                    (
                        "cache hit",
                        f"{turn.cache_hit_tokens} tokens ({turn.cache_hit_tokens / max(turn.prompt_tokens, 1):.0%})",
                    ),
                ]
            )
        )
        window = list(self.tbt_ms)
        self.query_one("#tbt", Static).update(
            _rows(
                [
                    ("p50 / p90", f"{percentile(window, 50):.1f} / {percentile(window, 90):.1f} ms"),
                ]
            )
        )
        self.query_one("#tbt-spark", Sparkline).data = window

    def show_engine(self, m: EngineMetrics) -> None:
        self.engine_metrics = m
        width = max(self.content_region.width, 10)
        bar = kv_bar(m, width)
        self.query_one("#kv", Static).update(
            Text("\n").join(
                [
                    bar,
                    Text(f"{m.kv_usage:.2%} in use ({m.page_size} tokens/page)"),
                    Text.assemble(("█", "bold green"), f" in use  {m.kv_pages_in_use}"),
                    Text.assemble(("▓", "yellow"), f" cached  {m.kv_pages_cached} (evictable)"),
                    Text.assemble(("░", "grey50"), f" free    {m.kv_pages_free}"),
                ]
            )
        )
        self.query_one("#sched", Static).update(
            _rows(
                [
                    ("running", str(m.running)),
                    ("waiting", str(m.waiting)),
                    ("finished", str(m.finished_requests)),
                    ("preempted", str(m.preemptions)),
                ]
            )
        )


class HistoryInput(Input):
    """An Input that recalls earlier entries with up/down."""

    BINDINGS = [
        Binding("up", "history(-1)", "Previous", show=False),
        Binding("down", "history(1)", "Next", show=False),
        Binding("enter", "submit", "Send"),
    ]

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.history: list[str] = []
        self._pos = 0
        self._draft = ""

    def remember(self, line: str) -> None:
        if line and (not self.history or self.history[-1] != line):
            self.history.append(line)
        self._pos = len(self.history)

    def action_history(self, step: int) -> None:
        if not self.history:
            return
        if self._pos == len(self.history):
            self._draft = self.value
        self._pos = min(max(self._pos + step, 0), len(self.history))
        self.value = self.history[self._pos] if self._pos < len(self.history) else self._draft
        self.cursor_position = len(self.value)
