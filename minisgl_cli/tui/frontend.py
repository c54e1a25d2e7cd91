"""The chat's process: `minisgl chat` loads the model and runs the engine loop (minisgl_cli.serve's
run_beside_front_end, as `serve` does); the chat itself, TUI or plain lines, runs here, in its child, on the same
terminal, and reaches the engine through RemoteLLM (tui/local.py says why apart). Started with a ChatFrontSpec as
JSON in argv[1] while the model still loads: its imports and tokenizer (~4 s on a 2-core CPU) overlap the load, and
it starts the chat once the engine's description arrives on a pipe of its own. `chat --url` runs run_chat in its
own process: a server is already apart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.ipc import Addresses, EngineInfo
from minisgl_cli.process_exit import exit_now

if TYPE_CHECKING:
    from minisgl_cli.tui.app import ChatApp
    from minisgl_cli.tui.session import Setting


@dataclass(frozen=True, slots=True)
class ChatFrontSpec:
    model: str | None  # as --model: where the tokenizer comes from
    addrs: Addresses
    engine_pid: int
    info_fd: int  # the engine's EngineInfo arrives here as one JSON line once it is up; end of file: it never will
    system: str | None
    temperature: float
    max_tokens: int
    sampling: dict[str, Setting]  # the sampling flags given (ChatSession.sampling)
    sampling_defaults: dict[str, Any]  # the model's generation_config.json values, as `minisgl chat` read them
    db: str | None  # the session store; None: nothing is saved
    resume_id: int | None  # the saved chat to reopen
    notice: str | None  # shown once the chat starts
    plain: bool  # lines on stdin/stdout instead of the TUI

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> ChatFrontSpec:
        d = json.loads(text)
        return ChatFrontSpec(**{**d, "addrs": Addresses(**d["addrs"])})


def run(spec: ChatFrontSpec) -> int:
    """The chat once the engine is up; its exit status (run_chat's)."""
    from engine.remote_llm import RemoteLLM
    from engine.tokenizer import load_tokenizer
    from minisgl_cli.tui.local import LocalBackend
    from minisgl_cli.tui.session import ChatSession, fit_session
    from minisgl_cli.tui.store import ChatStore

    try:
        tokenizer = load_tokenizer(spec.model)
    except Exception:  # a bad model: the engine's load, under way, reports it and never comes up
        tokenizer = None
    with open(spec.info_fd) as pipe:
        line = pipe.readline()
    if not line:
        return 0  # the model did not load (its error is on the terminal already), or the session was refused
    info = EngineInfo.from_wire(json.loads(line))
    # `minisgl chat` started this process with Ctrl-C ignored, so that Ctrl-C while the model loaded ended that
    # process alone (which then ends this one) instead of interrupting this one's imports with a traceback. The
    # chat takes it from here (the plain mode stops an answer with it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    backend = LocalBackend(
        RemoteLLM(tokenizer or load_tokenizer(spec.model), spec.addrs), info, spec.engine_pid, spec.sampling_defaults
    )
    store = ChatStore(Path(spec.db)) if spec.db is not None else None
    try:
        resumed: ChatSession | None = None
        inputs: list[str] = []
        if spec.resume_id is not None:  # `minisgl chat` read it once already: a bad id never gets here
            assert store is not None
            resumed, inputs = store.load(spec.resume_id)
        try:  # `minisgl chat` checked --max-tokens against the model's context; a smaller KV pool is known only now
            session = fit_session(
                resumed, backend.context_limit, spec.system, spec.temperature, spec.max_tokens, spec.sampling
            )
        except ValueError as e:
            print(f"Error: Invalid value for --max-tokens: {e}", file=sys.stderr)
            return 2
        return run_chat(backend, session, store, inputs, spec.notice, spec.plain)
    finally:
        if store is not None:
            store.close()


def run_chat(backend, session, store, inputs: list[str], notice: str | None, plain: bool) -> int:
    """The chat on this terminal, the TUI or plain lines, until it is left. Returns its exit status: 0 when left
    (ctrl+q, end of input), 1 if the TUI crashed, 128 + the signal that ended it (Ctrl-C: 130, SIGTERM: 143)."""
    try:
        if plain:
            from minisgl_cli.tui.plain import run_plain

            if notice:
                print(f"warning: {notice}", file=sys.stderr)
            return run_plain(backend, session, store, inputs)
        from minisgl_cli.tui.app import ChatApp

        return asyncio.run(_run_tui(ChatApp(backend, session, store, inputs, notice)))
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


async def _run_tui(app: ChatApp) -> int:
    """The app, ended as ctrl+q ends it on SIGTERM (`minisgl chat` ending its chat, or a kill) and SIGHUP (the
    terminal closed): the terminal is restored and an answer in flight is saved, which the default action of these
    signals (to die at once) skipped."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, partial(app.exit, return_code=128 + signal.SIGTERM))
    loop.add_signal_handler(signal.SIGHUP, partial(_hung_up, app))
    await app.run_async()
    return app.return_code or 0


# How long a terminal's restore may take after SIGHUP. A terminal that is gone could hold Textual's driver in its
# close (its writer thread never finishing) until `minisgl chat` killed this process 10 s later, in 2 of 4 tries.
HANGUP_EXIT_S = 2.0


def _hung_up(app: ChatApp) -> None:
    """SIGHUP: the answer in flight is saved first, then the app exits as on ctrl+q; if the terminal's restore does
    not finish (the terminal is gone), this process leaves without it."""
    if app.answer is not None:
        app.keep_answer(app.answer, cut=True)
    app.exit(return_code=128 + signal.SIGHUP)
    timer = threading.Timer(HANGUP_EXIT_S, os._exit, args=(128 + signal.SIGHUP,))
    timer.daemon = True  # a restore that finishes ends the process as usual, without waiting for it
    timer.start()


def main() -> None:
    exit_now(run(ChatFrontSpec.from_json(sys.argv[1])))


if __name__ == "__main__":
    main()
