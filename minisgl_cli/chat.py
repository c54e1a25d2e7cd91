"""`minisgl chat`: a Textual chat TUI with live TTFT/TBT and KV-cache numbers, or a plain line-by-line chat
(--no-tui, or automatically when stdin/stdout is not a terminal); against the in-process engine or, with --url,
any OpenAI-compatible server. Conversations are saved in SQLite (--db, --no-save) and can be resumed (--resume)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from minisgl_cli.options import (
    ENGINE_FLAG_NAMES,
    Seed,
    engine_config,
    generation_defaults,
    launcher_rank,
    load_llm,
    refuse_each,
    refuse_given,
    refuse_unread_engine_flags,
    with_engine_flags,
)
from minisgl_cli.report import INTERRUPTED_EXIT

if TYPE_CHECKING:
    from minisgl_cli.serve import LoopEnd
    from minisgl_cli.tui.session import Setting

System = Annotated[str | None, typer.Option("--system", "-s", help="system prompt")]
Temperature = Annotated[
    float, typer.Option("--temperature", "-t", help="sampling temperature (0 = greedy)", min=0.0, max=2.0)
]
MaxTokens = Annotated[int, typer.Option("--max-tokens", help="longest answer in tokens", min=1)]
TopP = Annotated[float, typer.Option("--top-p", help="nucleus sampling: the smallest set of tokens of this mass")]
TopK = Annotated[int, typer.Option("--top-k", help="sample among the k most likely tokens (0 or -1: all)")]
MinP = Annotated[float, typer.Option("--min-p", help="drop tokens below this fraction of the likeliest's probability")]
RepetitionPenalty = Annotated[
    float, typer.Option("--repetition-penalty", help="above 1 discourages repeating the conversation's tokens")
]
Stop = Annotated[
    list[str] | None,
    typer.Option(
        "--stop", help="end an answer before this text (repeatable, at most 4; \\n is a newline, \\\\ a backslash)"
    ),
]
NoTui = Annotated[bool, typer.Option("--no-tui", help="plain line-by-line chat on stdin/stdout")]
Url = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="chat with an OpenAI-compatible server (http://host:port, with or without /v1) instead of a local model",
    ),
]
ApiKey = Annotated[str | None, typer.Option("--api-key", help="bearer token for --url", envvar="OPENAI_API_KEY")]
ServedModel = Annotated[str | None, typer.Option("--served-model", help="model name at --url (default: its first)")]
Db = Annotated[
    Path | None, typer.Option("--db", help="session database (default: $XDG_DATA_HOME/minisgl/chat.db)", dir_okay=False)
]
NoSave = Annotated[
    bool, typer.Option("--no-save", help="a private chat: nothing is read from or written to the database")
]
Resume = Annotated[
    str | None,
    typer.Option("--resume", help="reopen the last saved chat (--resume), or the one with this id (--resume ID)"),
]
RESUME_LAST = "last"


def resume_flag(argv: list[str]) -> list[str]:
    """`minisgl chat --resume` may stand alone (the last chat): give it its value before the parser, which wants
    one (typer has no optional-value options)."""
    out = list(argv)
    if "chat" not in out[1:2]:
        return out
    for i, arg in enumerate(out):
        follows = out[i + 1] if i + 1 < len(out) else None
        if arg == "--resume" and (follows is None or (follows.startswith("-") and not follows[1:].isdigit())):
            out.insert(i + 1, RESUME_LAST)
            break
    return out


@with_engine_flags()
def chat(
    ctx: typer.Context,
    seed: Seed = 0,
    system: System = None,
    temperature: Temperature = 0.7,
    max_tokens: MaxTokens = 512,
    top_p: TopP = 1.0,
    top_k: TopK = -1,
    min_p: MinP = 0.0,
    repetition_penalty: RepetitionPenalty = 1.0,
    stop: Stop = None,
    no_tui: NoTui = False,
    url: Url = None,
    api_key: ApiKey = None,
    served_model: ServedModel = None,
    db: Db = None,
    no_save: NoSave = False,
    resume: Resume = None,
    **engine_flags: Any,
) -> None:
    """Chat with a model in the terminal, watching TTFT, TBT and KV-cache usage live; sessions are saved."""
    from minisgl_cli.tui.session import ChatSession
    from minisgl_cli.tui.store import ChatStore, StoreError, default_db_path

    if resume is not None and no_save:
        raise typer.BadParameter("--resume reads the database, which --no-save leaves alone", param_hint="--resume")
    if no_save:
        refuse_given(ctx, "names the session database, and --no-save reads and writes none", "db")
    sampling_flags = ("top_p", "top_k", "min_p", "repetition_penalty", "stop")
    if resume is not None:
        why = "--resume reopens the chat with its own settings: change them in the chat (/system, /temp, /set, ...)"
        refuse_given(ctx, why, "system", "temperature", "max_tokens", *sampling_flags)
    sampling = _sampling(
        dict(top_p=top_p, top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty, stop=stop or [])
    )
    if url is None:  # OPENAI_API_KEY set in the environment is no error: only a flag given here is
        no_url = "and there is no --url (chat runs the local engine)"
        refuse_each(
            ctx, {"served_model": f"names a model at --url, {no_url}", "api_key": f"is the key for --url, {no_url}"}
        )
    else:  # the server at --url runs its own engine: a flag for the local one would do nothing
        refuse_given(ctx, "set the local engine, which --url does not start", *ENGINE_FLAG_NAMES, "seed")
    resume_id = None if resume in (None, RESUME_LAST) else _session_id(resume)
    store, notice = None, None
    created = False  # the database file is this start's: a start refused before the chat leaves none behind
    if not no_save:
        path = db or default_db_path()
        created = not path.exists()
        if resume is not None and not path.exists():  # opening it would create an empty database to find nothing in
            raise typer.BadParameter(f"no saved chat in {path}: the file does not exist", param_hint="--resume")
        try:
            store = ChatStore(path)
        except StoreError as e:
            if resume is not None:
                raise typer.BadParameter(f"cannot resume: {e}", param_hint="--resume") from e
            notice = f"{e}; this chat is not saved (--db to use another file)"

    session: ChatSession | None = None
    inputs: list[str] = []
    if resume is not None:  # before the model loads: a bad id fails at once
        assert store is not None
        try:
            found = store.last_id() if resume_id is None else resume_id
            if found is None:
                raise typer.BadParameter(f"no saved chat in {store.path} yet", param_hint="--resume")
            session, inputs = store.load(found)
        except KeyError:
            raise typer.BadParameter(f"no chat {resume_id} in {store.path}", param_hint="--resume") from None
        except StoreError as e:
            raise typer.BadParameter(f"cannot resume: {e}", param_hint="--resume") from e

    plain = no_tui or not (sys.stdin.isatty() and sys.stdout.isatty())
    if url is not None:
        started = False
        try:
            from minisgl_cli.tui.frontend import run_chat

            backend = _connect(url, api_key, served_model, session.model if session else None)
            fitted = _fit(session, backend.context_limit, system, temperature, max_tokens, sampling)
            started = True
            code = run_chat(backend, fitted, store, inputs, notice, plain)
        finally:
            if store is not None:
                store.close()
                if created and not started:
                    _remove_unused(store.path)
        if code:
            raise typer.Exit(code)
        return
    config = engine_config(seed=seed, **engine_flags)
    refuse_unread_engine_flags(ctx, config)
    defaults = generation_defaults(
        config.model
    )  # a turn takes them for the fields the chat leaves unset (tui/local.py)
    # Tensor parallel: only rank 0 chats; the other ranks never return from load_llm (they follow rank 0's steps).
    front = None
    if launcher_rank() == 0:
        settings = dict(system=system, temperature=temperature, max_tokens=max_tokens, sampling=sampling, notice=notice)
        settings.update(sampling_defaults=defaults)
        settings.update(db=str(store.path) if store else None, resume_id=session.id if session else None)
        front = _ChatProcess(config.model, settings, plain)
    try:
        llm = load_llm(config)
        if front is not None:  # the chat's process takes Ctrl-C from here on (run_beside_front_end ignores it too)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        _fit(session, llm.engine.max_model_len, system, temperature, max_tokens, sampling)  # refused before the chat
    except BaseException as e:
        if front is not None:
            # load_llm ends a load that Ctrl-C cut short with INTERRUPTED_EXIT
            stopped = isinstance(e, typer.Exit) and e.exit_code == INTERRUPTED_EXIT
            front.abandon(interrupted=stopped or isinstance(e, KeyboardInterrupt))
        if store is not None and created:
            store.close()
            _remove_unused(store.path)
        raise
    finally:
        if store is not None:
            store.close()  # the chat's process opens its own
    assert front is not None
    code = front.run_beside(llm)
    if code:
        raise typer.Exit(code)


def _fit(session, limit: int | None, system: str | None, temperature: float, max_tokens: int, sampling: dict):
    from minisgl_cli.tui.session import fit_session

    try:
        return fit_session(session, limit, system, temperature, max_tokens, sampling)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--max-tokens") from e


def _sampling(flags: dict[str, Setting]) -> dict[str, Setting]:
    """The sampling flags given, each checked as `/set` checks it (a bad one refused by its flag's name); each
    `--stop` is one string, with /set stop's escapes."""
    from minisgl_cli.tui.session import ChatSession, unescape

    session = ChatSession()
    for name, value in flags.items():
        try:
            session.set_sampling(name, [unescape(s) for s in value] if isinstance(value, list) else value)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--" + name.replace("_", "-")) from e
    return session.sampling


class _ChatProcess:
    """The chat (minisgl_cli.tui.frontend), started as this process's child before the model loads, so that its
    imports and tokenizer overlap the load. This process then runs the engine loop beside it, as `serve` runs its HTTP
    front end, and tells it the engine is up by sending the engine's description on a pipe of its own."""

    def __init__(self, model: str | None, settings: dict[str, Any], plain: bool) -> None:
        from engine.ipc import Addresses
        from minisgl_cli.tui.frontend import ChatFrontSpec

        self.plain, self.addrs = plain, Addresses.temporary()
        read_end, self.info_pipe = os.pipe()
        spec = ChatFrontSpec(model, self.addrs, os.getpid(), read_end, plain=plain, **settings)
        # The chat's process computes no tensors: threads of its own would only take the engine's cores (on 2 cores
        # the TUI streamed 29 tok/s with one, 25-26 without).
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        argv = [sys.executable, "-m", "minisgl_cli.tui.frontend", spec.to_json()]
        # Started with Ctrl-C ignored (frontend.run takes it back once the chat starts): Ctrl-C while the model loads
        # ends this process, which then ends that one quietly, not in the middle of its imports with a traceback.
        was = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.proc = subprocess.Popen(argv, env=env, pass_fds=[read_end])
        finally:
            signal.signal(signal.SIGINT, was)
        os.close(read_end)

    def abandon(self, interrupted: bool = False) -> None:
        """The engine will not come up (the model failed to load, a setting was refused, Ctrl-C: `interrupted`): the
        chat ends unstarted."""
        os.close(self.info_pipe)
        if interrupted:  # at once, not once its tokenizer has loaded
            self.proc.terminate()
        self.proc.wait()
        self.addrs.remove()

    def run_beside(self, llm) -> int:
        """Run the engine loop until the chat ends; returns the exit code: the chat's (128 + the signal that ended
        it, as a shell reports it), 1 if the engine crashed, 128 + the signal that ended this process (SIGTERM,
        SIGHUP)."""
        from engine.engine_loop import engine_info
        from minisgl_cli.serve import run_beside_front_end

        if not self.plain and llm.engine.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # The TUI redraws on a core of its own: an OpenMP team that shares the TUI's core waits for it at every
            # barrier (2 cores: 30.6 tok/s at one thread against 24.0 at two; docs/benchmarks.md).
            import torch

            torch.set_num_threads(max(1, torch.get_num_threads() - 1))
        info = engine_info(llm)
        with os.fdopen(self.info_pipe, "w") as pipe:
            pipe.write(json.dumps(info.to_wire()) + "\n")
        end = run_beside_front_end(llm.engine, info, self.addrs, self.proc, "the chat", interactive=True)
        return chat_exit_code(end)


def _remove_unused(path: Path) -> None:
    """The database file a refused start created (`--max-tokens 100000`, `--num-pages 3`), removed if it holds no chat
    (another chat may have saved one since)."""
    from minisgl_cli.tui.store import ChatStore, StoreError

    try:
        again = ChatStore(path)
        try:
            if again.last_id() is not None:
                return
        finally:
            again.close()
        for f in (path, Path(f"{path}-journal"), Path(f"{path}-wal"), Path(f"{path}-shm")):
            f.unlink(missing_ok=True)
    except (OSError, StoreError):
        pass  # a file left behind is no error of the start's


def chat_exit_code(end: LoopEnd) -> int:
    """The chat's own code (128 + the signal that ended it, as a shell reports it), 1 if the engine crashed or the
    loop ended the chat for another reason (its torchrun launcher gone: the chat ended silently with 0), 128 + the
    signal that ended this process (SIGTERM, SIGHUP)."""
    if end.signum is not None and end.error is None:
        return 128 + end.signum
    if end.front_code is None or end.error:
        print(f"minisgl chat: {end.error or end.stopped_by or 'the engine loop ended'}", file=sys.stderr)
        return 1
    return 128 - end.front_code if end.front_code < 0 else end.front_code


def _session_id(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(
            f"a chat id is a number (got {value!r}); --resume alone opens the last chat", param_hint="--resume"
        ) from None


def _connect(url: str, api_key: str | None, served_model: str | None, resumed: str | None):
    from minisgl_cli.tui.remote import RemoteError
    from minisgl_cli.tui.server_backend import ServerBackend

    try:
        return ServerBackend.connect(url, api_key, served_model, resumed)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--url") from e
    except RemoteError as e:
        hint = "--served-model" if "serve" in str(e) and e.status is None else "--url"
        raise typer.BadParameter(str(e), param_hint=hint) from e


def register(app: typer.Typer) -> None:
    app.command()(chat)
