"""The Textual chat app. The engine runs in AsyncLLM's thread; this app only submits requests, consumes each
RequestStream with `async for` on its own event loop, and reads metrics through AsyncLLM.call off the UI loop,
so the UI never waits for a model step."""

from __future__ import annotations

import asyncio
import time

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.widgets import Footer, Header, Markdown
from textual.widgets.markdown import MarkdownStream

from engine.async_llm import AsyncLLM, EngineDeadError, RequestStream
from engine.llm import RequestOutput
from engine.metrics import EngineMetrics
from minisgl_cli.tui.commands import HELP, CommandError, is_command, run_command
from minisgl_cli.tui.session import ChatSession
from minisgl_cli.tui.stats import TurnStats, engine_rows, turn_rows
from minisgl_cli.tui.widgets import AssistantMessage, HistoryInput, MetricsPanel, NoteMessage, UserMessage


async def stop_markdown(md: MarkdownStream) -> None:
    """`MarkdownStream.stop()`, except when its render task was cancelled before it ever ran: then stop() re-raises
    that task's CancelledError into the caller, which would end the turn half-way (the turn never yielded to the
    loop: every output was already queued and every delta empty, e.g. bytes held back as incomplete UTF-8)."""
    try:
        await md.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # the worker itself is being cancelled: let that through
            raise


class ChatApp(App):
    TITLE = "minisgl chat"
    CSS = """
    #conversation { width: 1fr; padding: 0 1; }
    #prompt { dock: bottom; margin: 0 0 1 0; }
    """
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_conversation", "New chat"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]
    METRICS_HZ = 4  # engine metrics poll while idle; during an answer they refresh with the panel
    PANEL_INTERVAL = 0.05  # seconds between metrics-panel redraws while tokens stream in

    def __init__(self, engine: AsyncLLM, session: ChatSession) -> None:
        super().__init__()
        self.engine, self.session = engine, session
        info = engine.llm.describe()
        self.sub_title = (
            f"{info['model']} · {info['device']} · {info['dtype']} · attention {info['attention']} · TP {info['tp']}"
        )
        self.rid: str | None = None  # the request being generated, if any
        self.turn = TurnStats()
        self.last_metrics: EngineMetrics | None = None
        self._polling = False

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield VerticalScroll(id="conversation")
            yield MetricsPanel(id="metrics")
        yield HistoryInput(id="prompt", placeholder="Message (Enter to send, /help for commands)")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#conversation", VerticalScroll).anchor()
        self.query_one("#prompt").focus()
        self.query_one("#conversation").mount(
            NoteMessage(
                [
                    (
                        "Type a message and press enter. esc stops an answer, ctrl+n starts over, f1 or /help lists "
                        "commands.",
                        [],
                    )
                ]
            )
        )
        self.set_interval(1 / self.METRICS_HZ, self.refresh_metrics)
        self.refresh_metrics()

    def notify(self, message: str, *, markup: bool = False, **kw) -> None:
        """Plain text by default: messages quote user input and engine errors, which may contain [brackets]."""
        super().notify(message, markup=markup, **kw)

    @property
    def generating(self) -> bool:
        return self.rid is not None

    # ---- input ------------------------------------------------------------------------------------------
    async def on_input_submitted(self, event: HistoryInput.Submitted) -> None:
        line = event.value.strip()
        if not line:
            return
        box = self.query_one("#prompt", HistoryInput)
        box.remember(line)
        box.value = ""
        if is_command(line):
            await self.command(line)
        elif self.generating:
            self.notify("still answering: press Esc to stop it first", severity="warning")
        else:
            await self.send(line)

    async def command(self, line: str) -> None:
        try:
            result = run_command(line, self.session)
        except CommandError as e:
            self.notify(str(e), title="command", severity="error")
            return
        if result.action == "reset":
            await self.action_new_conversation()
        elif result.action == "stats":
            engine = engine_rows(self.last_metrics) if self.last_metrics else []
            await self.note([("Last turn", turn_rows(self.turn)), ("Engine", engine)])
        elif result.action == "help":
            await self.action_help()
        else:
            self.notify(result.message)

    async def note(self, sections: list[tuple[str, list[tuple[str, str]]]]) -> None:
        await self.query_one("#conversation").mount(NoteMessage(sections))

    # ---- one turn ---------------------------------------------------------------------------------------
    async def send(self, text: str) -> None:
        messages = self.session.messages(text)
        try:
            stream = self.engine.submit(messages, self.session.params(), loop=asyncio.get_running_loop())
        except (ValueError, EngineDeadError) as e:
            hint = " (try /reset or a smaller /max-tokens)" if isinstance(e, ValueError) and self.session.turns else ""
            self.notify(f"{e}{hint}", title="cannot send", severity="error")
            return
        self.rid = stream.rid
        pane = self.query_one("#conversation")
        reply = AssistantMessage()
        await pane.mount_all([UserMessage(text), reply])
        self.query_one(MetricsPanel).new_turn()
        self.generate(stream, text, reply)

    @work(exclusive=True, group="generate")
    async def generate(self, stream: RequestStream, text: str, reply: AssistantMessage) -> None:
        md = Markdown.get_stream(reply)  # coalesces fragments when tokens arrive faster than Markdown renders
        last: RequestOutput | None = None
        shown = 0.0
        try:
            async for out in stream:
                last = out
                await md.write(out.delta_text)
                if out.finished or time.monotonic() - shown >= self.PANEL_INTERVAL:
                    shown = time.monotonic()
                    self.turn = TurnStats.from_output(out)
                    self.query_one(MetricsPanel).show_turn(self.turn)
                    self.refresh_metrics()
        except EngineDeadError:
            pass  # reported below as a failed turn
        finally:
            if self.rid == stream.rid:  # ctrl+n may have moved on to a new request already
                self.rid = None
            await stop_markdown(md)
        reason = last.finish_reason if last is not None and last.finished else "error"
        if reason == "error":
            reply.add_class("-error")
            why = (last.error if last is not None else None) or self.engine.error or "engine stopped"
            self.notify(f"generation failed: {why}", severity="error")
            return
        assert last is not None
        if last.token_ids:
            self.session.commit(text, last.text)
        if reason == "abort":
            reply.add_class("-stopped")
            self.notify("stopped")
        elif reason == "length":
            self.notify(f"answer cut at {self.session.max_tokens} tokens (/max-tokens to change)")
        self.refresh_metrics()

    # ---- metrics ---------------------------------------------------------------------------------------
    def refresh_metrics(self) -> None:
        """Read EngineMetrics on the engine thread without blocking the UI loop; skip if a read is pending."""
        if not self._polling and self.engine.alive:
            self._polling = True
            self.run_worker(self._read_metrics(), group="metrics")

    async def _read_metrics(self) -> None:
        try:
            m = await asyncio.to_thread(self.engine.call, lambda llm: llm.metrics(), 5.0)
        except Exception:  # a busy or stopped engine: try again at the next tick
            return
        finally:
            self._polling = False
        self.last_metrics = m
        try:
            self.query_one(MetricsPanel).show_engine(m)
        except NoMatches:  # the read outlived the screen: the app is closing and its widgets are gone
            pass

    # ---- key bindings ----------------------------------------------------------------------------------
    def action_stop(self) -> None:
        if self.rid is not None:
            self.engine.abort(self.rid)

    async def action_new_conversation(self) -> None:
        if self.rid is not None:  # drop the answer in flight: its worker must not add it to the new history
            self.engine.abort(self.rid)
            self.workers.cancel_group(self, "generate")
            self.rid = None
        self.session.reset()
        await self.query_one("#conversation").remove_children()
        self.notify("new conversation" + (f" (system: {self.session.system})" if self.session.system else ""))

    async def action_help(self) -> None:
        keys = [(self.get_key_display(b), b.description) for b in self.BINDINGS if isinstance(b, Binding)]
        await self.note([("Keys", [("enter", "Send"), ("up / down", "input history")] + keys), ("Commands", HELP)])
