"""Line-by-line chat on stdin/stdout (for pipes, logs and terminals without a TUI): same backends, session, saving
and slash commands. Answers stream to stdout; thinking, per-turn numbers and command feedback go to stderr."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from minisgl_cli.tui.backend import Answer, BackendError, ChatBackend
from minisgl_cli.tui.commands import (
    HELP,
    CommandError,
    is_command,
    messages_count,
    model_command,
    run_command,
    takes_lines,
)
from minisgl_cli.tui.export import export
from minisgl_cli.tui.session import ChatMessage, ChatSession, go_on_with
from minisgl_cli.tui.stats import Load, load_rows, ms, settings_rows, turn_rows
from minisgl_cli.tui.store import ChatStore, StoreError
from minisgl_cli.tui.turn import TurnReader, TurnStats


class TurnFailed(ValueError):
    """The answer failed (its error on the way): `stats` are its numbers, which /stats shows then, as the TUI does."""

    def __init__(self, message: str, stats: TurnStats) -> None:
        super().__init__(message)
        self.stats = stats


class LoopThread:
    """An event loop in a thread of its own: turns run there while the main thread waits and can take Ctrl-C."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="minisgl-chat-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def run_plain(
    backend: ChatBackend,
    session: ChatSession,
    store: ChatStore | None = None,
    inputs: list[str] | None = None,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
    stderr: TextIO = sys.stderr,
) -> int:
    """The chat until end of input. Returns 0, or 1 when input came from a pipe or file and a turn failed, a command
    was refused or a chat is left unsaved (its last saves failed, or those of a chat left by /reset; each said so on an
    `error:` line), so that a script can tell; at a terminal the person saw them."""
    interactive = stdin.isatty()
    failed_turns = refused_commands = failed_saves = 0
    lost_saves = 0  # the failed saves of chats left by /reset (no later save writes them)
    inputs = list(inputs or [])

    def save() -> None:
        # each save writes the whole chat: one that works makes up for those that failed before it
        nonlocal failed_saves
        failed_saves = 0 if _save(store, session, inputs, stderr) else failed_saves + 1

    other_model = go_on_with(session, backend.model)  # saved with the chat and in its exports, as the TUI does
    print(f"minisgl chat · {backend.title}   (/help for commands, Ctrl-D to quit)", file=stderr)
    if session.id is not None:
        print(f"resumed chat {session.id}: {session.title} ({messages_count(len(session.history))})", file=stderr)
        save()  # now the last chat, as in the TUI
    if other_model:
        print(f"warning: {other_model}", file=stderr)
    loop = LoopThread()
    loop.run(backend.ready())
    last = session.last("assistant")  # /stats's last turn: a resumed chat's own, as the TUI shows it
    turn = (session.history[last].stats if last is not None else None) or TurnStats()
    ended_by, restore_signals = _end_on_signals()

    def more() -> None:  # the prompt inside a message of several lines
        stderr.write("... ")
        stderr.flush()

    try:
        while not ended_by:
            if interactive:  # on stderr: `chat --no-tui > answers.txt` keeps the answers alone
                stderr.write("\n> ")
                stderr.flush()
            line = stdin.readline()
            if not line:
                if interactive:  # Ctrl-D at the prompt: the shell's prompt on a line of its own
                    stderr.write("\n")
                break
            line = line.strip()
            block = line.startswith(BLOCK)
            if block:
                try:
                    line = _read_block(line, stdin, more if interactive else None)
                except KeyboardInterrupt:
                    if not interactive:
                        raise
                    # as ollama's: Ctrl-C in a message of several lines drops it, the chat goes on (it quit it)
                    stderr.write("\n(message dropped)\n")
                    continue
            if not line.strip():
                continue
            inputs.append(line)
            text: str | None = line
            keep = len(session.history)
            if is_command(line) and (not block or takes_lines(line)):
                done = _command(line, loop, backend, session, turn, stderr)
                if not isinstance(done, Resend):
                    refused_commands += not done
                    if session.id is None and not session.history:  # /reset: a new session, its own input history
                        inputs[:] = [line]
                        turn = TurnStats()  # and no last turn: /stats showed the left chat's
                        lost_saves, failed_saves = lost_saves + failed_saves, 0
                    save()
                    continue
                text, keep = done.text, done.keep  # /regen, /edit: a turn in place of the last
            try:
                turn = _answer(loop, backend, session, text, stdout, stderr, save, keep)
            except (ValueError, BackendError) as e:
                print(f"error: {e}", file=stderr)
                if isinstance(e, BackendError):
                    raise SystemExit(1) from e
                if isinstance(e, TurnFailed):  # a refused one (too long) never began: the last turn stays
                    turn = e.stats
                failed_turns += 1
                continue
            if ended_by:  # the answer was stopped and saved; the terminal may be gone (SIGHUP)
                break
            m = loop.run(backend.load())
            kv = ""
            if m is not None and m.kv_pages_in_use is not None:
                kv = f" · KV {m.kv_pages_in_use} in use, {m.kv_pages_cached} cached, {m.kv_pages_free} free"
            print(
                f"[{turn.finish_reason} · TTFT {ms(turn.ttft)} · {turn.decode_tps:.1f} tok/s · "
                f"{turn.output_tokens} tokens · cache hit {turn.cache_hit_tokens}/{turn.prompt_tokens}{kv}]",
                file=stderr,
            )
    except KeyboardInterrupt:
        if not ended_by:  # Ctrl-C at the prompt: the caller's
            raise
    finally:
        restore_signals()
        loop.run(backend.aclose())
        loop.close()
    if ended_by:
        raise SystemExit(128 + ended_by[0])
    counts = (
        (failed_turns, "turn", "failed"),
        (refused_commands, "command", "refused"),
        (lost_saves + failed_saves, "save", "failed"),
    )
    if interactive or not any(n for n, _, _ in counts):
        return 0
    what = [f"{n} {noun}{'s' if n > 1 else ''} {verb}" for n, noun, verb in counts if n]
    print(f"minisgl chat: {' and '.join(what)} (exit status 1)", file=stderr)
    return 1


BLOCK = '"""'  # ollama's multi-line input


def _read_block(first: str, stdin: TextIO, prompt: Callable[[], object] | None) -> str:
    """A message of several lines, as ollama's prompt takes it: from a line starting with \"\"\" to the line ending
    with \"\"\" (or the end of input), those marks left out; one line per input line otherwise. Text of several
    lines that starts with "/" is a message, except /system and /edit (as in the TUI); `prompt` shows a continuation
    prompt."""
    rest = first[len(BLOCK) :]
    if rest.endswith(BLOCK):  # all on one line
        return rest[: -len(BLOCK)]
    lines = [rest] if rest else []
    while True:
        if prompt is not None:
            prompt()
        line = stdin.readline()
        if not line:
            break
        line = line.rstrip("\n")
        if line.rstrip().endswith(BLOCK):
            lines.append(line.rstrip()[: -len(BLOCK)])
            break
        lines.append(line)
    return "\n".join(lines).strip("\n")


def _end_on_signals() -> tuple[list[int], Callable[[], None]]:
    """SIGTERM (`kill`, or `minisgl chat` ending its chat) and SIGHUP (the terminal closing) end the chat as Ctrl-D
    does, a running answer stopped and saved first, as the TUI leaves (their default action killed the process
    mid-answer, the answer unsaved). Returns the list that the signal, once caught, is put in (off the main thread,
    where signals cannot be caught, it stays empty), and what puts the previous handlers back."""
    ended_by: list[int] = []

    def end(signum: int, _frame: object) -> None:
        if not ended_by:
            ended_by.append(signum)
            raise KeyboardInterrupt  # wakes the main thread where it waits: at the prompt, or for the answer

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, end)
        if before[signal.SIGHUP] is not signal.SIG_IGN:  # nohup's choice stands
            signal.signal(signal.SIGHUP, end)

    def restore() -> None:
        if threading.current_thread() is threading.main_thread():
            for s, handler in before.items():
                signal.signal(s, handler)

    return ended_by, restore


@contextlib.contextmanager
def _signals_held(stop: Callable[[], None] | None = None) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP wait until the block is done, then act as they would have. A save is not to be cut:
    a signal between the store's COMMIT and its note of the new chat's id left the chat saved without an id, so the
    save after the stopped answer wrote it again as a second chat (the first one holding the question alone).
    With `stop` (an answer streaming, then saved): each signal calls it at once, and Ctrl-C, which means "stop the
    answer" there, is not acted on again afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[tuple[int, Any]] = []

    def hold(signum: int, frame: Any) -> None:
        if stop is not None:
            stop()
            if signum == signal.SIGINT:
                return
        held.append((signum, frame))

    before: dict[int, Any] = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s, handler in before.items():
        if handler not in (signal.SIG_IGN, None):  # None: a handler not set from Python, left alone
            signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in before.items():
            if handler is not None:
                signal.signal(s, handler)
        # each as if it came now, all of them: the first to raise (Ctrl-C's KeyboardInterrupt) dropped the rest
        raised: BaseException | None = None
        for signum, frame in held:
            handler = before[signum]
            try:
                if callable(handler):
                    handler(signum, frame)
                elif handler == signal.SIG_DFL:
                    signal.raise_signal(signum)
            except BaseException as e:
                raised = raised or e
        if raised is not None:
            raise raised


def _save(store: ChatStore | None, session: ChatSession, inputs: list[str], err: TextIO) -> bool:
    """False if the save failed (said on an `error:` line); the next one writes the whole chat again."""
    if store is not None and (session.history or session.id is not None):
        try:
            with _signals_held():
                moved = store.save(session, inputs)
        except StoreError as e:
            print(f"error: not saved: {e}", file=err)
            return False
        if moved is not None:
            print(f"warning: {moved}", file=err)
    return True


@dataclass(frozen=True, slots=True)
class Resend:
    """/regen or /edit: a turn that answers the conversation's first `keep` messages followed by `text` (None: they
    end with the user's message); the messages after them go once the backend takes the request."""

    keep: int
    text: str | None


def _answer(
    loop: LoopThread,
    backend: ChatBackend,
    session: ChatSession,
    text: str | None,
    stdout: TextIO,
    stderr: TextIO,
    save: Callable[[], None],
    keep: int,
) -> TurnStats:
    """Stream the answer to history[:keep] and `text` (a new message; None: the kept history ends with the user's) to
    stdout, its thinking to stderr; Ctrl-C stops it (the partial answer stays). The answer streams on the loop thread;
    the session is saved on this one, where the store's SQLite connection lives."""
    started: list[Answer] = []
    stopping: list[bool] = []  # a signal asked to stop the answer (maybe before the backend took it)
    begun: concurrent.futures.Future[None] = concurrent.futures.Future()  # the request was taken, or refused

    def start() -> Answer:
        try:
            new = [] if text is None else [{"role": "user", "content": text}]
            answer = backend.start(session.messages(keep) + new, session.params(), session.thinking)
            session.cut(keep)  # the answer (and message) this turn replaces, once the backend took it
            if text is not None:
                session.add(ChatMessage("user", text, created=time.time()))
            started.append(answer)
            if stopping:  # asked before it was taken: stop it now
                answer.stop()
            return answer
        finally:
            begun.set_result(None)

    def stop() -> None:  # from the main thread's signal handler: the answer streams on the loop thread
        stopping.append(True)
        if started:
            loop.loop.call_soon_threadsafe(started[0].stop)

    async def read() -> TurnReader:
        answer = start()
        turn = TurnReader(answer.started, answer.opens_in_thinking)
        async for piece in answer:
            thought, said = turn.add(piece)
            if thought:
                stderr.write(thought)
                stderr.flush()
            stdout.write(said)
            stdout.flush()
        return turn

    # From the request to its answer's save, a signal stops the answer and never raises: its KeyboardInterrupt once
    # landed between the answer's end and the save (SIGTERM from `minisgl chat` comes as its engine stops, which ends
    # the answer), leaving the answer unsaved (CI at 30c8c84, and at ba7850c between the wait and the save's hold).
    # SIGTERM and SIGHUP then act as they would have, once the answer is saved.
    with _signals_held(stop):
        future = asyncio.run_coroutine_threadsafe(read(), loop.loop)
        either: list[concurrent.futures.Future[Any]] = [begun, future]
        concurrent.futures.wait(either, return_when=concurrent.futures.FIRST_COMPLETED)
        if started:  # the user's message, once the backend took it
            save()
        turn = future.result()
        with contextlib.suppress(OSError):  # a terminal gone (SIGHUP): the answer is saved all the same
            stdout.write("\n")
            stdout.flush()
        stats = turn.stats
        if turn.content or turn.reasoning or stats.output_tokens:
            session.add(ChatMessage("assistant", turn.content, turn.reasoning.strip(), stats, time.time()))
            save()
    if stats.finish_reason == "error":
        raise TurnFailed(f"generation failed: {turn.error or 'the answer stream ended early'}", stats)
    return stats


def _command(
    line: str, loop: LoopThread, backend: ChatBackend, session: ChatSession, turn: TurnStats, out: TextIO
) -> bool | Resend:
    """Run a slash command, its feedback on `out`; False if it was refused (or could not do what it says), a Resend
    for the turn /regen or /edit asks for."""
    try:
        result = run_command(line, session, backend.thinking_switch)
        if result.action in ("regen", "edit"):
            return _resend(result.action, result.args, session)
    except CommandError as e:
        print(f"error: {e}", file=out)
        return False
    done = True
    if result.action == "stats":
        load: Load | None = loop.run(backend.load())
        rows = settings_rows(session) + turn_rows(turn) + (load_rows(load) if load else [])
    elif result.action == "help":
        tui_only = {"/copy", "/sessions", "/delete"}
        rows = [(k, f"{v} (TUI only)" if k.split()[0] in tui_only else v) for k, v in HELP]
        # the TUI's ctrl+j is a new line in its box; here a message of several lines goes between triple quotes
        rows = [(k, v.replace("ctrl+j for more lines", f"{BLOCK}/system ...{BLOCK} for more lines")) for k, v in rows]
        rows += [(BLOCK, f"a message of several lines: from a line starting with {BLOCK} to one ending with it")]
        rows += [("Ctrl-C", "stop the answer"), ("Ctrl-D", "quit")]
    elif result.action == "export":
        fmt, path, overwrite = result.args
        try:
            rows = [("", f"exported to {export(session, fmt, path, overwrite=bool(overwrite))}")]
        except (OSError, ValueError) as e:
            rows, done = [("", f"error: cannot export: {e}")], False
    elif result.action == "model":
        try:
            said = loop.run(model_command(result.args[0], session, backend))
        except CommandError as e:
            said, done = f"error: {e}", False
        rows = said if isinstance(said, list) else [("", said)]
    elif result.action in ("copy", "sessions", "delete"):  # the "(TUI only)" of /help
        rows, done = [("", f"error: {line.split()[0]} is for the TUI (run without --no-tui)")], False
    else:
        rows = [("", result.message)]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}".rstrip() if key else value, file=out)
    return done


def _resend(action: str, args: tuple[str, ...], session: ChatSession) -> Resend:
    """/regen: the last answer again (or the answer to a message whose turn failed); /edit <text>: `text` in place of
    the last message, which /edit alone cannot edit here (no box to put it in), so it says how."""
    if action == "regen":
        keep = session.answer_again_from()
        if keep is None:
            raise CommandError("nothing to answer again yet")
        return Resend(keep, None)
    i = session.last("user")
    if i is None:
        raise CommandError("no message to edit yet")
    if not args:
        raise CommandError('/edit needs the new message: /edit <text> (several lines: """/edit ...""")')
    return Resend(i, args[0])
