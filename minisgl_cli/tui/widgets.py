"""The chat's widgets: message bubbles, the live metrics panel (TTFT, TBT sparkline, KV-cache bar), and an
input box with history."""

from __future__ import annotations

from collections import deque

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Collapsible, Markdown, Sparkline, Static, TextArea

from minisgl_cli.tui.stats import Load, ms
from minisgl_cli.tui.turn import TurnStats, tbt_percentile


def _rows(rows: list[tuple[str, str]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, value in rows:
        table.add_row(Text(key), Text(value))  # Text: help and numbers hold [brackets], not markup
    return table


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { background: $boost; border-left: thick $accent; padding: 0 1; margin: 1 0 0 0; }
    UserMessage.-editing { border-left: thick $warning; }
    """

    def __init__(self, text: str, index: int) -> None:
        super().__init__(Text(text))
        self.index = index  # position in the session's history


def _hard_breaks(state: StateCore) -> None:
    for token in state.tokens:
        for child in token.children or []:
            if child.type == "softbreak":
                child.type = "hardbreak"


def _too_deep(state: StateCore) -> None:
    """markdown-it stops reading blocks nested past its maxNesting (20 levels of lists in lists, or of `>`) and drops
    the rest of the text without a word: SmolLM2 looping "1. 1. 2. 3. 4. ..." for 400 tokens (each `N. ` opens a list
    inside the last) showed an empty answer. Such a text is shown as one paragraph, its lines kept, its inline
    Markdown still read. Only blockquotes and list items read blocks nested in them, one level below their own."""
    deepest = state.md.options.maxNesting - 1
    if not any(t.type in ("blockquote_open", "list_item_open") and t.level >= deepest for t in state.tokens):
        return
    lines = [0, state.src.count("\n") + 1]
    state.tokens = [
        Token("paragraph_open", "p", 1, map=lines, block=True),
        Token("inline", "", 0, map=lines, content=state.src.strip(), level=1, block=True, children=[]),
        Token("paragraph_close", "p", -1, block=True),
    ]


def model_markdown() -> MarkdownIt:
    """Textual's parser, with a single newline a line break (Markdown makes it a space: a poem ran together into
    one paragraph), as chat UIs show a model's text. markdown-it's `breaks` option is for its HTML renderer only;
    Textual reads the tokens, so the soft breaks become hard ones."""
    md = MarkdownIt("gfm-like", {"html": False})  # a model's "<int>" or "<div>" is text to show, not HTML to drop
    md.core.ruler.after("block", "too_deep", _too_deep)  # before "inline", which reads the paragraph it leaves
    md.core.ruler.push("hard_breaks", _hard_breaks)
    return md


class AnswerMarkdown(Markdown):
    DEFAULT_CSS = """
    AnswerMarkdown { padding: 0; margin: 0; }
    AnswerMarkdown MarkdownBlock:last-child { margin-bottom: 0; }
    """

    def __init__(self, markdown: str = "") -> None:
        super().__init__(markdown, parser_factory=model_markdown)


class ThinkingBlock(Collapsible):
    """A reasoning model's thinking, apart from its answer: open while it streams, folded once the answer starts."""

    DEFAULT_CSS = """
    ThinkingBlock { padding: 0; margin: 0 0 1 0; border-top: none; background: $surface; color: $text-muted; }
    ThinkingBlock Contents { padding: 0 0 0 2; }
    ThinkingBlock Markdown { padding: 0; margin: 0; color: $text-muted; }
    """

    def __init__(self, text: str = "", collapsed: bool = False) -> None:
        self.body = Markdown(text, parser_factory=model_markdown)
        super().__init__(self.body, title="Thinking…", collapsed=collapsed)


class AssistantMessage(Vertical):
    """An answer: its thinking (if any) in a ThinkingBlock, then the answer as Markdown."""

    DEFAULT_CSS = """
    AssistantMessage { height: auto; border-left: thick $success; padding: 0 1; margin: 1 0 0 0; }
    AssistantMessage.-stopped { border-left: thick $warning; }
    AssistantMessage.-error { border-left: thick $error; }
    """

    def __init__(self, index: int, content: str = "", reasoning: str = "", reasoning_tokens: int = 0) -> None:
        super().__init__()
        self.index = index  # position its message has (or will have) in the session's history
        self.answer = AnswerMarkdown(content)
        self.thinking: ThinkingBlock | None = None
        if reasoning:
            self.thinking = ThinkingBlock(reasoning, collapsed=True)
            self.thinking.title = thought_title(reasoning_tokens)

    def compose(self) -> ComposeResult:
        if self.thinking is not None:
            yield self.thinking
        yield self.answer

    async def open_thinking(self) -> Markdown:
        """The thinking's Markdown, mounting the block above the answer the first time."""
        if self.thinking is None:
            self.thinking = ThinkingBlock()
            await self.mount(self.thinking, before=self.answer)
        return self.thinking.body


def thought_title(tokens: int) -> str:
    return f"Thought · {tokens} tokens" if tokens else "Thought"


class NoteMessage(Static):
    """Help, /stats output and other messages from the app itself (never sent to the model):
    titled sections of (key, value) rows."""

    DEFAULT_CSS = """
    NoteMessage { border-left: thick $secondary; padding: 0 1; margin: 1 0 0 0; }
    """

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]]) -> None:
        parts: list[Text | Table] = []
        for title, rows in sections:
            parts += [Text(title, style="bold"), _rows(rows)]
        super().__init__(Group(*parts))


def kv_bar(m: Load, width: int) -> Text:
    """Pages in use (solid), cached/evictable (shaded), free (light), in proportion to the pool; from the usage
    fraction alone when the source gives no page counts."""
    if m.kv_pages_total:
        total = m.kv_pages_total
        in_use, cached = m.kv_pages_in_use or 0, m.kv_pages_cached or 0
    else:
        total, in_use, cached = 10_000, round((m.kv_usage or 0) * 10_000), 0
    used = round(width * in_use / total)
    shaded = round(width * cached / total)
    if in_use and not used:
        used = 1  # any page in use shows as at least one cell
    if cached and not shaded:
        shaded = 1
    shaded = min(shaded, width - used)
    return Text.assemble(
        ("█" * used, "bold green"), ("▓" * shaded, "yellow"), ("░" * (width - used - shaded), "grey50")
    )


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


class MetricsPanel(VerticalScroll):
    """Live numbers: the last turn (TTFT, TBT, tok/s, cache hits) and the load (KV pages, requests), which is
    hidden when its source (a server without known /metrics) gives none."""

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
        self.load: Load | None = None
        self._turn_itls = 0  # gaps of the current turn already in the window

    def compose(self) -> ComposeResult:
        yield Static("Last turn", classes="title")
        yield Static(id="turn")
        yield Static(f"TBT, last {self.WINDOW} tokens", classes="title")
        yield Static(id="tbt")
        yield Sparkline([], id="tbt-spark")
        yield Static("KV cache", classes="title load")
        yield Static(id="kv", classes="load")
        yield Static("Scheduler", classes="title load")
        yield Static(id="sched", classes="load")

    def on_mount(self) -> None:
        self.show_turn(self.turn)
        self.show_load(None)

    def new_turn(self) -> None:
        self._turn_itls = 0

    def clear_turns(self) -> None:
        """A new chat: no last turn, and an empty TBT window (the old chat's numbers stayed)."""
        self.tbt_ms.clear()
        self._turn_itls = 0
        self.show_turn(TurnStats())

    def show_turn(self, turn: TurnStats) -> None:
        self.turn = turn
        self.tbt_ms.extend(g * 1e3 for g in turn.itls[self._turn_itls :])
        self._turn_itls = len(turn.itls)
        rows = [
            ("TTFT", ms(turn.ttft)),
            ("decode", f"{turn.decode_tps:.1f} tok/s"),
            # no prompt has 0 tokens: 0 is not known yet (a server's usage comes with its last chunk, none if stopped)
            ("tokens", f"{turn.prompt_tokens or '-'} in / {turn.output_tokens} out"),
        ]
        if turn.reasoning_tokens:
            rows.append(("thinking", f"{turn.reasoning_tokens} tokens"))
        hit = turn.cache_hit_tokens / max(turn.prompt_tokens, 1)
        rows.append(("cache hit", f"{turn.cache_hit_tokens} tokens ({hit:.0%})" if turn.prompt_tokens else "-"))
        self.query_one("#turn", Static).update(_rows(rows))
        window = list(self.tbt_ms)
        self.query_one("#tbt", Static).update(
            _rows([("p50 / p90", f"{tbt_percentile(window, 50):.1f} / {tbt_percentile(window, 90):.1f} ms")])
        )
        self.query_one("#tbt-spark", Sparkline).data = window

    def show_load(self, m: Load | None) -> None:
        self.load = m
        for part in self.query(".load"):
            part.display = m is not None
        if m is None:
            return
        unit = "tokens" if m.source == "sglang" else "pages"
        lines = [kv_bar(m, max(self.content_region.width, 10))]
        if m.kv_usage is not None:
            per_page = f" ({m.page_size} tokens/page)" if m.page_size and m.source != "sglang" else ""
            lines.append(Text(f"{m.kv_usage:.2%} in use{per_page}"))
        if m.kv_pages_in_use is not None:
            lines.append(Text.assemble(("█", "bold green"), f" in use  {m.kv_pages_in_use}"))
        if m.kv_pages_cached is not None:
            lines.append(Text.assemble(("▓", "yellow"), f" cached  {m.kv_pages_cached} (evictable)"))
        if m.kv_pages_free is not None:
            lines.append(Text.assemble(("░", "grey50"), f" free    {m.kv_pages_free}"))
        if m.source != "engine":
            lines.append(Text(f"from {m.source} /metrics, {unit}", style="italic grey50"))
        if m.stale:
            lines.append(Text("as of the last step: the engine is in a long one", style="italic yellow"))
        self.query_one("#kv", Static).update(Text("\n").join(lines))
        self.query_one("#sched", Static).update(
            _rows(
                [
                    ("running", _count(m.running)),
                    ("waiting", _count(m.waiting)),
                    ("finished", _count(m.finished_requests)),
                    ("preempted", _count(m.preemptions)),
                ]
            )
        )


class PromptBox(TextArea):
    """The message box: Enter sends, ctrl+j adds a line (so do shift+enter and alt+enter in terminals that report
    them); in multi-line mode (f2) Enter adds a line and ctrl+s sends. Up on the first line and down on the last
    recall earlier entries."""

    BINDINGS = [
        Binding("up", "history(-1)", "Previous", show=False),
        Binding("down", "history(1)", "Next", show=False),
        Binding("enter", "send", "Send"),  # for the footer: _on_key sends (or adds a line in multi-line mode)
        Binding("ctrl+s", "send", "Send", show=False),
        # TextArea's own: ctrl+w / alt+backspace / ctrl+backspace, alt+delete, ctrl+u, ctrl+k, home / end, ctrl+a / e,
        # ctrl+left / right (what most terminals' alt+b / f read as); added: an editor's ctrl+delete
        Binding("ctrl+delete", "delete_word_right", "Delete word right", show=False),
    ]
    # readline's alt keys, handled in _on_key: they come with their letter as the character (ESC d is alt+d, "d"),
    # which TextArea types before a binding is looked at (alt+d typed a "d")
    ALT_KEYS = {"alt+d": "delete_word_right", "alt+b": "cursor_word_left", "alt+f": "cursor_word_right"}
    NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")
    DEFAULT_CSS = """
    PromptBox { height: auto; min-height: 3; max-height: 10; }
    PromptBox.-multiline { border: tall $warning; }
    """

    class Submitted(Message):
        def __init__(self, box: PromptBox, value: str) -> None:
            super().__init__()
            self.box, self.value = box, value

    def __init__(self, **kw) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, highlight_cursor_line=False, **kw)
        self.entries: list[str] = []
        self.multiline = False
        self._pos = 0
        self._draft = ""

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

    def set_multiline(self, on: bool) -> None:
        self.multiline = on
        self.set_class(on, "-multiline")
        self.border_subtitle = "multi-line: enter adds a line, ctrl+s sends (f2: off)" if on else ""

    async def _on_key(self, event: events.Key) -> None:
        # Handled here, not as bindings: a binding's action runs later than the keys typed after it, so a newline
        # or a send in a burst of keys (a paste, tmux send-keys) would land out of order.
        if event.key == "enter" and not self.multiline:
            event.stop()
            event.prevent_default()
            self.action_send()
            return
        if event.key in self.NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.action_newline()
            return
        if event.key in self.ALT_KEYS:
            event.stop()
            event.prevent_default()
            await self.run_action(self.ALT_KEYS[event.key])
            return
        await super()._on_key(event)

    def action_send(self) -> None:
        text = self.text
        # emptied now, in order with the keys: what is typed after enter (a burst, a fast typist) is the next
        # message, not appended to this one; the app puts a refused message back
        self.text = ""
        self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        self.insert("\n")

    def remember(self, line: str) -> None:
        if line and (not self.entries or self.entries[-1] != line):
            self.entries.append(line)
        self._pos = len(self.entries)

    def set_history(self, lines: list[str]) -> None:
        self.entries = list(lines)
        self._pos = len(self.entries)

    def action_history(self, step: int) -> None:
        edge = self.cursor_at_first_line if step < 0 else self.cursor_at_last_line
        if not edge or not self.entries:
            (self.action_cursor_up if step < 0 else self.action_cursor_down)()
            return
        if self._pos == len(self.entries):
            self._draft = self.text
        pos = min(max(self._pos + step, 0), len(self.entries))
        if pos == self._pos:
            return
        self._pos = pos
        self.value = self.entries[pos] if pos < len(self.entries) else self._draft
