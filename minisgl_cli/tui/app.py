"""The Textual chat app. It talks to one ChatBackend (the in-process engine, or a server with --url): it starts
answers and consumes their Pieces with `async for` on its own event loop, and reads the load behind the panel off
the UI loop, so the UI never waits for a model step or a server. The conversation is saved to the ChatStore at every
change (when there is one)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.dom import DOMNode
from textual.timer import Timer
from textual.widget import MountError, Widget
from textual.widgets import Footer, Header, Markdown
from textual.widgets.markdown import MarkdownStream

from minisgl_cli.tui.backend import Answer, BackendError, ChatBackend
from minisgl_cli.tui.commands import (
    DELETE_KEY,
    HELP,
    CommandError,
    is_command,
    messages_count,
    model_command,
    run_command,
    takes_lines,
)
from minisgl_cli.tui.export import code_blocks, export
from minisgl_cli.tui.session import ChatMessage, ChatSession, go_on_with
from minisgl_cli.tui.sessions_screen import Renamed, SessionsScreen
from minisgl_cli.tui.stats import Load, load_rows, settings_rows, turn_rows
from minisgl_cli.tui.store import ChatStore, StoreError
from minisgl_cli.tui.turn import TurnReader, TurnStats
from minisgl_cli.tui.widgets import (
    AssistantMessage,
    MetricsPanel,
    NoteMessage,
    PromptBox,
    ThinkingBlock,
    UserMessage,
    thought_title,
)

WELCOME = (
    "Type a message and press enter (ctrl+j: new line, f2: multi-line mode). esc stops an answer, "
    "ctrl+r answers again, ctrl+g edits your last message, ctrl+o lists saved chats, f1 or /help lists everything."
)

KEY_HELP = {
    "stop": "stop the answer (or cancel an edit)",
    "new_conversation": "new chat",
    "regenerate": "answer the last message again",
    "edit_last": "edit your last message and send it again",
    "copy_answer": "copy the last answer (a click on a message copies that one)",
    "sessions": "saved chats: open (enter), rename (r), delete (d d), filter (/)",
    "delete_chat": "delete this chat (press twice); a new empty chat follows",
    "multiline": "multi-line mode: enter adds lines, ctrl+s sends",
    "help": "this help",
    "quit": "quit",
}
STOP_NOTICE_S = 1.0  # an answer still running this long after esc is said to be stopping
STOPPING = "stopping: the engine ends its current step first (a long prompt's prefill can take a while)"


def _short(title: str, width: int = 32) -> str:
    return title if len(title) <= width else title[: width - 1] + "…"


async def stop_markdown(md: MarkdownStream) -> None:
    """`MarkdownStream.stop()`, except when its render task was cancelled before it ever ran: then stop() re-raises
    that task's CancelledError into the caller, which would end the turn half-way (the turn never yielded to the
    loop: every output was already queued and every delta empty, e.g. bytes held back as incomplete UTF-8). And
    when the message is no longer on screen (ctrl+q mid-answer took the screen down): the stream's last flush of the
    text it held raised MountError, which replaced the turn's cancellation and failed the worker. That text is
    dropped; the answer is kept from the engine's tokens, not from the widget."""
    try:
        await md.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # the worker itself is being cancelled: let that through
            raise
    except MountError:
        if md.markdown_widget.is_attached:
            raise


class ChatApp(App):
    TITLE = "minisgl chat"
    CSS = """
    #conversation { width: 1fr; padding: 0 1; }
    #prompt { dock: bottom; margin: 0 0 1 0; }
    Screen.-narrow #metrics { display: none; }
    """
    # Below 90 columns the 40-column metrics panel would leave the conversation too little room: it is hidden
    # until the terminal is wider again (/stats shows the same numbers), and a notice says so.
    METRICS_MIN_WIDTH = 90
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (METRICS_MIN_WIDTH, "-wide")]
    BINDINGS = [
        Binding("escape", "stop", "Stop", key_display="esc"),  # as the chat's text names it, and the footer did
        Binding("ctrl+n", "new_conversation", "New chat"),
        Binding("ctrl+r", "regenerate", "Again"),
        Binding("ctrl+g", "edit_last", "Edit"),
        Binding("f3", "copy_answer", "Copy"),
        Binding("ctrl+o", "sessions", "Chats"),
        # oterm's ctrl+backspace and an editor's ctrl+delete edit the input box here (delete a word left / right); the
        # footer is full at 120 columns: f1 lists it
        Binding(DELETE_KEY, "delete_chat", "Delete", show=False),
        Binding("f2", "multiline", "Multi-line"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]
    METRICS_HZ = 4  # load poll while idle; during an answer it refreshes with the panel
    PANEL_INTERVAL = 0.05  # seconds between metrics-panel redraws while tokens stream in

    def __init__(
        self,
        backend: ChatBackend,
        session: ChatSession,
        store: ChatStore | None = None,
        inputs: list[str] | None = None,
        notice: str | None = None,
    ) -> None:
        """store: where the session is saved (None: not saved). inputs: the session's input history (resumed).
        notice: shown as a warning at start (e.g. why the chat is not being saved)."""
        super().__init__()
        self.backend, self.session, self.store = backend, session, store
        self._model_notice = go_on_with(self.session, backend.model)
        self.sub_title = backend.title
        self.answer: Answer | None = None  # the answer being generated, if any
        self._reading: tuple[Answer, TurnReader] | None = None  # an answer not yet in the session
        self.turn = TurnStats()
        self.last_metrics: Load | None = None
        self._narrow_noted = False  # the narrow terminal's notice shown since it last was wide enough
        self.editing: int | None = None  # history index of the user message being edited
        self.draft = ""  # what the input box held when the edit began (ctrl+g); end_edit puts it back
        self.save_error: str | None = None
        self._inputs = list(inputs or [])
        self._notice = notice
        self._polling = False
        self._delete_armed: tuple[int, int] | None = (
            None  # (chat id, its messages) a first ctrl+shift+delete was pressed on
        )

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield VerticalScroll(id="conversation")
            yield MetricsPanel(id="metrics")
        self.input_box = PromptBox(id="prompt", placeholder="Message (Enter to send, /help for commands)")
        yield self.input_box
        yield Footer()

    async def on_mount(self) -> None:
        await self.backend.ready()
        self.query_one("#conversation", VerticalScroll).anchor()
        box = self.query_one(PromptBox)
        box.set_history(self._inputs)
        box.focus()
        await self.note([(WELCOME, [])])
        await self.show_history()
        if self.session.id is not None:
            self.save()  # a resumed chat is now the last one, as one opened with ctrl+o: the next --resume comes back
        if self._notice:
            self.say(self._notice, severity="warning", timeout=10)
        if self._model_notice:
            self.say(self._model_notice, severity="warning", timeout=10)
        self.set_interval(1 / self.METRICS_HZ, self.refresh_metrics)
        self.refresh_metrics()

    async def action_quit(self) -> None:
        """ctrl+q: an answer in flight is stopped and kept as it stands at the key press. Kept only at unmount, it went
        on arriving while the app closed (a busy machine's teardown took long enough for a fast model to finish)."""
        if self.answer is not None:
            self.answer.stop()
            self.keep_answer(self.answer, cut=True)
        self.exit()

    async def on_unmount(self) -> None:
        if self.answer is not None:  # the app ends mid-answer (ctrl+q, SIGTERM): keep what had arrived
            self.keep_answer(self.answer, cut=True)
        await self.backend.aclose()

    def say(self, message: str, **kw) -> None:
        """A notice of ours, as plain text: it may quote user input, titles and engine errors, which may hold
        [brackets]. (Textual's own notices, e.g. the one ctrl+c shows, go through notify() and keep their markup.)"""
        self.notify(message, markup=False, **kw)

    @property
    def generating(self) -> bool:
        return self.answer is not None

    # ---- the conversation on screen --------------------------------------------------------------------------
    async def show_history(self) -> None:
        """Mount the session's messages (a resumed or opened chat) and its last answer's numbers."""
        pane = self.query_one("#conversation")
        widgets: list[Widget] = []
        for i, m in enumerate(self.session.history):
            if m.role == "user":
                widgets.append(UserMessage(m.content, i))
            else:
                tokens = m.stats.reasoning_tokens if m.stats else 0
                reply = AssistantMessage(i, m.content, m.reasoning, tokens)
                if m.stats and m.stats.finish_reason in ("abort", "error"):
                    reply.add_class("-stopped" if m.stats.finish_reason == "abort" else "-error")
                widgets.append(reply)
        await pane.mount_all(widgets)
        last = self.session.last("assistant")
        stats = self.session.history[last].stats if last is not None else None
        if stats is not None:
            self.turn = stats
            self.query_one(MetricsPanel).show_turn(stats)
        self.title = _short(self.session.title) or "minisgl chat"

    async def drop_from(self, index: int) -> None:
        """Remove history[index:] from the session and the screen."""
        self.session.cut(index)
        for w in list(self.query(UserMessage)) + list(self.query(AssistantMessage)):
            if w.index >= index:
                await w.remove()

    def save(self) -> None:
        """Write the session (nothing until it has a message). A failure is shown once and retried at the next
        change; the conversation stays in memory meanwhile."""
        if self.store is None or (self.session.id is None and not self.session.history):
            return
        try:
            moved = self.store.save(self.session, self.input_box.entries)  # the box itself: at exit it is unmounted
        except StoreError as e:
            if self.save_error is None:
                self.say(
                    f"{e} — the chat stays open and is saved at the next change",
                    title="not saved",
                    severity="error",
                    timeout=10,
                )
            self.save_error = str(e)
            return
        if moved is not None:
            self.say(moved, title="saved as a new chat", severity="warning", timeout=10)
        if self.save_error is not None:
            self.say("saved again")
            self.save_error = None
        self.title = _short(self.session.title) or "minisgl chat"

    # ---- input ------------------------------------------------------------------------------------------
    async def on_prompt_box_submitted(self, event: PromptBox.Submitted) -> None:
        line = event.value.strip()
        if not line:
            return  # blanks alone send nothing (the box emptied itself on enter)
        box = event.box
        edit_text = line.split(maxsplit=1)[0] == "/edit" and len(line.split(maxsplit=1)) > 1
        if is_command(line) and ("\n" not in line or takes_lines(line)) and not (edit_text and self.generating):
            box.remember(line)
            await self.command(line)
        elif self.generating:
            self.say("still answering: press Esc to stop it first", severity="warning")
            box.value = event.value + box.value  # kept, ahead of anything typed since
        elif await self.send(line):
            box.remember(line)
        else:
            box.value = event.value + box.value

    async def command(self, line: str) -> None:
        if line.split(maxsplit=1)[0] == "/reset":
            # as ctrl+n: an answer in flight is kept in its own chat first (run_command would reset the session
            # before, and the partial answer would be saved alone, as a new "untitled" chat)
            await self.action_new_conversation()
            return
        try:
            result = run_command(line, self.session, self.backend.thinking_switch)
        except CommandError as e:
            self.say(str(e), title="command", severity="error")
            return
        if result.action == "reset":
            await self.action_new_conversation()
            return
        if result.action == "stats":
            load = load_rows(self.last_metrics) if self.last_metrics else [("", "no numbers from this backend")]
            await self.note(
                [("Settings", settings_rows(self.session)), ("Last turn", turn_rows(self.turn)), ("Load", load)]
            )
        elif result.action == "help":
            await self.action_help()
        elif result.action == "regen":
            await self.action_regenerate()
        elif result.action == "edit" and result.args:
            await self.send_in_place(result.args[0])
        elif result.action == "edit":
            self.action_edit_last()
        elif result.action == "copy":
            self.copy(*result.args)
        elif result.action == "export":
            self.export(*result.args)
        elif result.action == "sessions":
            self.action_sessions()
        elif result.action == "delete":
            await self.action_delete_chat("/delete")
            return  # nothing left to save
        elif result.action == "model":
            await self.choose_model(*result.args)
        else:
            self.say(result.message)
        self.save()

    async def choose_model(self, name: str) -> None:
        """/model: list the served models, or answer with another (not mid-answer: the answer streaming is the
        model's it began with)."""
        if name and self.generating:
            self.say("still answering: press Esc to stop it first", severity="warning")
            return
        try:
            said = await model_command(name, self.session, self.backend)
        except CommandError as e:
            self.say(str(e), title="model", severity="error")
            return
        if isinstance(said, list):
            await self.note([("Models", said)])
        else:
            self.sub_title = self.backend.title
            self.say(said)

    async def note(self, sections: list[tuple[str, list[tuple[str, str]]]]) -> None:
        await self.query_one("#conversation").mount(NoteMessage(sections))

    # ---- one turn ---------------------------------------------------------------------------------------
    async def send(self, text: str) -> bool:
        """Send a new user message (in place of the one being edited, if any); False if it was refused."""
        keep = self.editing if self.editing is not None else len(self.session.history)
        messages = self.session.messages(keep)
        answer = self.start(messages + [{"role": "user", "content": text}])
        if answer is None:
            return False
        if self.editing is not None:
            self.end_edit(self.input_box.value)  # after what it held before ctrl+g, anything typed since enter
            await self.drop_from(keep)
        self.session.add(ChatMessage("user", text, created=time.time()))
        await self.query_one("#conversation").mount(UserMessage(text, len(self.session.history) - 1))
        self.save()
        await self.follow(answer)
        return True

    def start(self, messages: list[dict[str, str]]) -> Answer | None:
        """Send; the app is generating from here on (before any await), or the refusal is shown and None returned."""
        try:
            self.answer = self.backend.start(messages, self.session.params(), self.session.thinking)
            return self.answer
        except (ValueError, BackendError) as e:  # a conversation too long says what to do (backend.too_long)
            self.say(str(e), title="cannot send", severity="error", timeout=10)
            return None

    async def follow(self, answer: Answer) -> None:
        self.answer = answer
        reply = AssistantMessage(len(self.session.history))
        # under its question: after ctrl+r a /stats or /help note may follow the question, where the old answer was
        turns = list(self.query("#conversation > UserMessage, #conversation > AssistantMessage"))
        await self.query_one("#conversation").mount(reply, after=turns[-1] if turns else None)
        self.query_one(MetricsPanel).new_turn()
        self.generate(answer, reply)

    @work(exclusive=True, group="generate")
    async def generate(self, answer: Answer, reply: AssistantMessage) -> None:
        try:
            await self._generate(answer, reply)
        finally:  # the turn is over once its message is in the session
            self.keep_answer(answer, cut=True)  # cancelled (the app exits): what had arrived, as a stopped answer
            if self.answer is answer:  # ctrl+n may have moved on to a new answer already
                self.answer = None

    async def _generate(self, answer: Answer, reply: AssistantMessage) -> None:
        md = Markdown.get_stream(reply.answer)  # coalesces fragments when tokens arrive faster than Markdown renders
        think_md: MarkdownStream | None = None
        turn = TurnReader(answer.started, answer.opens_in_thinking)
        self._reading = (answer, turn)
        shown = 0.0
        trailing: Timer | None = None

        def show_later() -> None:
            nonlocal trailing, shown
            trailing, shown = None, time.monotonic()
            self.show_turn(turn, reply)

        try:
            async for piece in answer:
                thought, said = turn.add(piece)
                if thought:
                    if think_md is None:
                        think_md = Markdown.get_stream(await reply.open_thinking())
                    await think_md.write(thought)
                if said:
                    if reply.thinking is not None and len(turn.content) == len(said):
                        reply.thinking.collapsed = True  # the answer begins: fold the thinking away
                    await md.write(said)
                if turn.finished or time.monotonic() - shown >= self.PANEL_INTERVAL:
                    shown = time.monotonic()
                    self.show_turn(turn, reply)
                elif trailing is None:  # the stream may pause here: show these numbers a little later anyway
                    trailing = self.set_timer(self.PANEL_INTERVAL, show_later)
                if turn.finished:
                    break
        finally:
            if trailing is not None:
                trailing.stop()
            await stop_markdown(md)
            if think_md is not None:
                await stop_markdown(think_md)
        stats = turn.stats
        self.show_turn(turn, reply)
        self.keep_answer(answer)
        reason = stats.finish_reason
        if reason == "error":
            reply.add_class("-error")
            why = turn.error if turn.finished else "the answer stream ended early"
            kept = "partial answer kept" if turn.content or turn.reasoning else "your message is kept"
            self.say(f"generation failed: {why} ({kept}; ctrl+r tries again)", severity="error", timeout=10)
        elif reason == "abort":
            reply.add_class("-stopped")
            self.say("stopped")
        elif reason == "length":
            self.say(f"answer cut at {self.session.max_tokens} tokens (/max-tokens to change)")
        elif not turn.content.strip() and not turn.reasoning.strip():  # an empty bubble alone said nothing
            self.say("the model ended its answer without a word (ctrl+r tries again)", severity="warning")
        self.refresh_metrics()

    def keep_answer(self, answer: Answer, cut: bool = False) -> None:
        """Add `answer` to the session and save it, once: when it ends, or `cut` short when the chat moves on
        mid-answer (ctrl+n, the app exits), with what had arrived, as a stopped answer. A partial answer (stopped,
        failed) stays as shown."""
        if self._reading is None or self._reading[0] is not answer:
            return
        turn, self._reading = self._reading[1], None
        stats = turn.stats if turn.finished or not cut else dataclasses.replace(turn.meter.stats, finish_reason="abort")
        if turn.content or turn.reasoning or stats.output_tokens:
            self.session.add(ChatMessage("assistant", turn.content, turn.reasoning.strip(), stats, time.time()))
            self.save()

    def show_turn(self, turn: TurnReader, reply: AssistantMessage) -> None:
        if self._reading is None or self._reading[1] is not turn:  # the chat moved on (ctrl+n): a late timer's call
            return
        stats = turn.stats if turn.finished else turn.meter.stats
        self.turn = dataclasses.replace(stats, itls=list(stats.itls))  # what the panel shows, as it shows it
        try:
            self.query_one(MetricsPanel).show_turn(self.turn)
        except NoMatches:  # a late timer's call while the app closes mid-answer: its widgets are gone (CI at 1bbb2b9)
            return
        if reply.thinking is not None:
            tokens = self.turn.reasoning_tokens
            reply.thinking.title = f"Thinking… {tokens} tokens" if turn.thinking else thought_title(tokens)
        self.refresh_metrics()

    # ---- metrics ---------------------------------------------------------------------------------------
    def refresh_metrics(self) -> None:
        """Read the load without blocking the UI loop; skip if a read is pending."""
        narrow = self.size.width < self.METRICS_MIN_WIDTH
        if narrow and not self._narrow_noted:  # the panel the chat is about vanished without a word in 80 columns
            self.say(
                f"the live metrics panel shows from {self.METRICS_MIN_WIDTH} columns (this terminal: "
                f"{self.size.width}): widen it, or /stats for the numbers",
                timeout=8,
            )
        self._narrow_noted = narrow
        if not self._polling:
            self._polling = True
            # the method, not a coroutine: a worker the closing app never starts leaves none un-awaited behind
            self.run_worker(self._read_metrics, group="metrics")  # type: ignore[arg-type]  # Textual types Coroutine[None, None, T]

    async def _read_metrics(self) -> None:
        try:
            m = await self.backend.load()
        finally:
            self._polling = False
        self.last_metrics = m
        try:
            self.query_one(MetricsPanel).show_load(m)
        except NoMatches:  # the read outlived the screen: the app is closing and its widgets are gone
            pass

    # ---- actions ------------------------------------------------------------------------------------------
    def action_stop(self) -> None:
        if self.answer is not None:
            answer = self.answer
            answer.stop()
            # the engine takes a stop between steps: after a long prompt's prefill (tens of seconds on a CPU), which
            # showed nothing meanwhile, as if Esc had not been heard
            self.set_timer(STOP_NOTICE_S, lambda: self._still_stopping(answer))
        elif self.editing is not None:
            self.cancel_edit()

    def _still_stopping(self, answer: Answer) -> None:
        if self.answer is answer:
            self.say(STOPPING, timeout=30)

    async def action_new_conversation(self, notice: str = "new conversation") -> None:
        if self.answer is not None:  # end the answer in flight: kept in its own chat, not in the new one
            self.answer.stop()
            self.keep_answer(self.answer, cut=True)
            self.workers.cancel_group(self, "generate")
            self.answer = None
        if self.editing is not None:  # the box holds the old chat's message under edit: it goes with that chat
            self.end_edit()
        self.session.reset()
        self.query_one(PromptBox).set_history([])  # what is typed in it stays: a question drafted for the new chat
        self.turn = TurnStats()  # before the await below: the new chat's state is whole before anything else runs
        self.query_one(MetricsPanel).clear_turns()
        self.title = "minisgl chat"
        await self.query_one("#conversation").remove_children()
        self.say(notice + (f" (system: {self.session.system})" if self.session.system else ""))

    async def action_delete_chat(self, again: str = DELETE_KEY) -> None:
        """Delete the open chat from the database, on a second press as the saved-chats list's `d d` (the chat
        unchanged in between: a message sent after the first press asks again); a new empty chat follows, with the
        same settings, as after ctrl+n."""
        if self.generating:
            self.say("still answering: press Esc to stop it first", severity="warning")
            return
        id = self.session.id
        if self.store is None or id is None:
            self.say("this chat is not saved: nothing to delete (ctrl+n starts a new one)", severity="warning")
            return
        title = self.session.title
        if self._delete_armed != (id, len(self.session.history)):
            self._delete_armed = (id, len(self.session.history))
            self.say(f"press {again} again to delete {title!r}", severity="warning")
            return
        self._delete_armed = None
        try:
            self.store.delete(id)
        except StoreError as e:
            self.say(str(e), title="not deleted", severity="error", timeout=10)
            return
        await self.action_new_conversation(f"deleted {title!r}; a new conversation")

    async def action_regenerate(self) -> None:
        if self.generating:
            self.say("still answering: press Esc to stop it first", severity="warning")
            return
        keep = self.session.answer_again_from()
        if keep is None:
            self.say("nothing to answer again yet", severity="warning")
            return
        answer = self.start(self.session.messages(keep))
        if answer is None:
            return
        if keep < len(self.session.history):
            await self.drop_from(keep)
        else:
            for w in self.query(AssistantMessage):  # the failed attempt's empty bubble
                if w.index >= len(self.session.history):
                    await w.remove()
        self.save()
        await self.follow(answer)

    async def send_in_place(self, text: str) -> None:
        """/edit <text>: `text` sent in place of the last message (as the plain mode does); refused, it waits in the
        box under edit, to be fixed and sent with enter."""
        i = self.session.last("user")
        if i is None:
            self.say("no message to edit yet", severity="warning")
            return
        self.editing, self.draft = i, ""
        if not await self.send(text):
            self.action_edit_last(text)

    def action_edit_last(self, text: str = "") -> None:
        """ctrl+g, /edit: the last message into the box to edit and send in its place (`text`: that text)."""
        if self.generating:
            self.say("still answering: press Esc to stop it first", severity="warning")
            return
        i = self.session.last("user")
        if i is None:
            self.say("no message to edit yet", severity="warning")
            return
        box = self.query_one(PromptBox)
        if self.editing is None:  # a question being typed: kept for after the edit (a second ctrl+g keeps it too)
            self.draft = box.value
        self.editing = i
        for w in self.query(UserMessage):
            w.set_class(w.index == i, "-editing")
        box.value = text or self.session.history[i].content
        box.focus()
        self.say("editing your last message: enter sends it in its place, esc cancels")

    def cancel_edit(self) -> None:
        for w in self.query(UserMessage):
            w.remove_class("-editing")
        self.end_edit()
        self.say("edit cancelled")

    def end_edit(self, typed: str = "") -> None:
        """The edit is over (sent, cancelled, or its chat left): the box holds what it held before ctrl+g, then `typed`.
        A question being typed was replaced by the message to edit, and esc or ctrl+n emptied the box: it was lost."""
        self.editing = None
        self.input_box.value, self.draft = self.draft + typed, ""

    def action_copy_answer(self) -> None:
        self.copy("", "")

    def on_key(self, event: events.Key) -> None:
        """A character typed while the conversation or the panel has the focus (a click on a message, which copies it,
        gives it to the conversation; so does tab, to scroll with the keys) goes into the input box, which takes the
        focus back: it was lost, and so was the next question typed after a click. Enter and the new-line keys follow
        it there and do what they do in the box: in a burst (a paste ending in a newline, a fast typist) the Enter
        comes before the box has the focus, and was lost, the text left unsent. Keys the focused widget handled (its
        bindings: pageup, home...) and those on another screen (the saved chats, the palette) never get here."""
        box = self.input_box
        if self.screen is not box.screen or self.focused is box:
            return
        if event.is_printable and event.character:
            event.stop()
            box.focus()
            box.insert(event.character)
        elif event.key == "enter" or event.key in box.NEWLINE_KEYS:
            event.stop()
            box.focus()
            if event.key == "enter" and not box.multiline:
                box.action_send()
            else:
                box.action_newline()

    def on_paste(self, event: events.Paste) -> None:
        """A paste (a terminal's bracketed paste is one event, not keys) while the conversation or the panel has the
        focus goes into the input box, as typed characters do: it was lost. Its newlines are lines of the message, as
        when pasted in the box. (The box's own pastes bubble here too, handled: it has the focus then.)"""
        box = self.input_box
        if event.text and self.screen is box.screen and self.focused is not box:
            event.stop()
            box.focus()
            box.insert(event.text)

    def on_click(self, event: events.Click) -> None:
        """A click on a message copies it (oterm's way): any question or answer, not only the last answer. Not after
        a drag (the mouse selected text, which ctrl+c copies), not on a thinking block (its title folds it), and not
        a double click (a word selected)."""
        if event.chain > 1 or self.screen.get_selected_text():
            return
        node: DOMNode | None = event.widget
        while node is not None and not isinstance(node, (UserMessage, AssistantMessage, ThinkingBlock)):
            node = node.parent
        if not isinstance(node, (UserMessage, AssistantMessage)):
            return
        history = self.session.history
        what, role = ("question", "user") if isinstance(node, UserMessage) else ("answer", "assistant")
        if node.index >= len(history) and self.generating:  # the answer in flight joins the history when it ends
            self.say("that answer is still coming: copy it once it is done", severity="warning")
            return
        if node.index >= len(history) or history[node.index].role != role:
            # an answer that ended before its first token is not kept: its bubble's index is the next message's
            self.say("that answer ended without a word: nothing to copy", severity="warning")
            return
        text = history[node.index].content
        self.copy_to_clipboard(text)
        self.say(f"copied the {what} ({len(text)} characters)")

    def copy(self, what: str, n: str) -> None:
        i = self.session.last("assistant")
        if i is None:
            self.say("no answer to copy yet", severity="warning")
            return
        text = self.session.history[i].content
        if what == "code":
            blocks = code_blocks(text)
            if not blocks:
                self.say("the last answer has no code block", severity="warning")
                return
            k = int(n) if n else len(blocks)
            if k > len(blocks):
                self.say(f"the last answer has {len(blocks)} code block(s), not {k}", severity="warning")
                return
            text, label = blocks[k - 1], f"code block {k} of {len(blocks)}"
        else:
            label = "the last answer"
        self.copy_to_clipboard(text)
        self.say(f"copied {label} ({len(text)} characters)")

    def export(self, fmt: str, path: str, overwrite: str) -> None:
        if self.generating:
            # the answer joins the session when it ends: the file held the question alone, as if it had none (the
            # plain mode reads a command only between turns)
            self.say("still answering: /export once the answer is done (esc stops it)", severity="warning")
            return
        try:
            target = export(self.session, fmt, path, overwrite=bool(overwrite))
        except (OSError, ValueError) as e:
            self.say(f"cannot export: {e}", title="export", severity="error")
            return
        self.say(f"exported to {target}")

    def action_multiline(self) -> None:
        box = self.query_one(PromptBox)
        box.set_multiline(not box.multiline)
        self.say("multi-line: enter adds a line, ctrl+s sends" if box.multiline else "enter sends")

    def action_sessions(self) -> None:
        if self.store is None:
            self.say("this chat is not being saved (--no-save, or the database cannot be opened)", severity="warning")
            return
        self.push_screen(SessionsScreen(self.store, self.session.id), self.open_session)

    async def open_session(self, id: int | None) -> None:
        if id is None or id == self.session.id or self.store is None:
            return
        if self.generating:
            self.say("still answering: press Esc to stop it first", severity="warning")
            return
        try:
            session, inputs = self.store.load(id, self.backend.context_limit)
        except (StoreError, KeyError) as e:
            self.say(f"cannot open chat {id}: {e}", severity="error")
            return
        if self.editing is not None:  # the box holds the left chat's message under edit: it goes with that chat
            self.end_edit()  # (as ctrl+n), or enter sent it into the opened chat as a new one
        self.session = session
        model_notice = go_on_with(session, self.backend.model)
        self.query_one(PromptBox).set_history(inputs)
        # the chat left behind's numbers go: show_history shows the opened chat's last turn (if it has one) in an
        # empty TBT window, as --resume does
        self.turn = TurnStats()
        self.query_one(MetricsPanel).clear_turns()
        await self.query_one("#conversation").remove_children()
        await self.show_history()
        self.save()  # now the last chat: --resume comes back to it
        self.say(f"opened {session.title!r} ({messages_count(len(session.history))})")
        if model_notice:
            self.say(model_notice, severity="warning", timeout=10)

    def on_renamed(self, event: Renamed) -> None:
        if event.id == self.session.id:
            self.session.title = event.title
            self.title = _short(event.title)

    async def action_help(self) -> None:
        # what each key does, where the footer has room for a word only ("Again", "Chats"); each key named as the
        # chat's notices and this list's first rows name them (ctrl+shift+delete), not as the footer shows them
        # (Textual's "shift+^del")
        keys = [
            (b.key_display or b.key, KEY_HELP.get(b.action, b.description))
            for b in self.BINDINGS
            if isinstance(b, Binding)
        ]
        keys = [
            ("enter", "send"),
            ("ctrl+j (shift+enter)", "new line (f2: enter adds lines, ctrl+s sends)"),
            ("up / down", "input history"),
            ("ctrl+w / ctrl+delete", "delete a word left / right (ctrl+u, ctrl+k: to the line's start / end)"),
            ("tab, then pageup / pagedown", "scroll the conversation (shift+tab back to the input)"),
        ] + keys
        await self.note([("Keys", keys), ("Commands", HELP)])
