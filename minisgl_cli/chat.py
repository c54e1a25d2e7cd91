"""`minisgl chat`: a Textual chat TUI with live TTFT/TBT and KV-cache numbers, or a plain line-by-line chat
(--no-tui, or automatically when stdin/stdout is not a terminal); against the in-process engine or, with --url,
any OpenAI-compatible server. Conversations are saved in SQLite (--db, --no-save) and can be resumed (--resume)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from minisgl_cli.options import (
    Seed,
    engine_config,
    load_llm,
    with_engine_flags,
)

System = Annotated[str | None, typer.Option("--system", "-s", help="system prompt")]
Temperature = Annotated[
    float, typer.Option("--temperature", "-t", help="sampling temperature (0 = greedy)", min=0.0, max=2.0)
]
MaxTokens = Annotated[int, typer.Option("--max-tokens", help="longest answer in tokens", min=1)]
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
        if arg == "--resume" and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out.insert(i + 1, RESUME_LAST)
            break
    return out


@with_engine_flags()
def chat(
    seed: Seed = 0,
    system: System = None,
    temperature: Temperature = 0.7,
    max_tokens: MaxTokens = 512,
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
    resume_id = None if resume in (None, RESUME_LAST) else _session_id(resume)
    store, notice = None, None
    if not no_save:
        path = db or default_db_path()
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

    engine = None
    if url is not None:
        backend = _connect(url, api_key, served_model)
    else:
        config = engine_config(seed=seed, **engine_flags)
        from engine.async_llm import AsyncLLM
        from minisgl_cli.tui.local import LocalBackend

        llm = load_llm(config)
        # Tensor parallel: ranks other than 0 run the engine's follower loop here and return; only rank 0 chats.
        engine = AsyncLLM(llm)
        backend = LocalBackend(engine)
    try:
        limit = backend.context_limit
        if session is not None:
            session.max_tokens_limit = limit
            if limit is not None and session.max_tokens >= limit:
                session.max_tokens = limit - 1
        else:
            try:
                session = ChatSession(
                    system=system, temperature=temperature, max_tokens=max_tokens, max_tokens_limit=limit
                )
            except ValueError as e:
                raise typer.BadParameter(str(e), param_hint="--max-tokens") from e
        if no_tui or not (sys.stdin.isatty() and sys.stdout.isatty()):
            from minisgl_cli.tui.plain import run_plain

            if notice:
                print(f"warning: {notice}", file=sys.stderr)
            run_plain(backend, session, store, inputs)
        else:
            from minisgl_cli.tui.app import ChatApp

            ChatApp(backend, session, store, inputs, notice).run()
    except KeyboardInterrupt:
        pass
    finally:
        if engine is not None:
            engine.shutdown()
        if store is not None:
            store.close()


def _session_id(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"a chat id is a number (got {value!r}); --resume alone opens the last chat") from None


def _connect(url: str, api_key: str | None, served_model: str | None):
    from minisgl_cli.tui.remote import RemoteError
    from minisgl_cli.tui.server_backend import ServerBackend

    try:
        return ServerBackend.connect(url, api_key, served_model)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--url") from e
    except RemoteError as e:
        hint = "--served-model" if "serve" in str(e) and e.status is None else "--url"
        raise typer.BadParameter(str(e), param_hint=hint) from e


def register(app: typer.Typer) -> None:
    app.command()(chat)
