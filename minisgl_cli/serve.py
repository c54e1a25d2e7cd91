"""`minisgl serve`: the OpenAI-compatible HTTP server. This process (rank 0 under torchrun) runs the engine loop;
the HTTP front end (FastAPI + uvicorn, tokenizer, SSE) runs in a child process; the other torchrun ranks follow
the engine steps rank 0 broadcasts. docs/serve.md draws the layout."""

from __future__ import annotations

import dataclasses
import enum
import errno
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from engine.config import MAX_LOGPROBS
from minisgl_cli.child_process import stop_process
from minisgl_cli.options import (
    Seed,
    engine_config,
    generation_defaults,
    launcher_rank,
    load_llm,
    refuse_unread_engine_flags,
    with_engine_flags,
)
from minisgl_cli.server.frontend_spec import API_KEY_ENV, ORPHAN_GRACE_S, FrontendSpec

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.engine_loop import EngineLoop
    from engine.ipc import Addresses, EngineInfo
    from engine.llm import LLM


class LogLevel(enum.StrEnum):
    critical = "critical"
    error = "error"
    warning = "warning"
    info = "info"
    debug = "debug"


class GenerationConfig(enum.StrEnum):
    auto = "auto"
    none = "none"


GenConfig = Annotated[
    GenerationConfig,
    typer.Option(
        help="auto: a request that leaves out temperature, top_p, top_k, min_p or repetition_penalty gets the value "
        "in the model's generation_config.json, and one without max_tokens its max_new_tokens (within what the "
        "context leaves), as vLLM's server does by default; none: the API's own defaults (temperature 1, no top-p/k, "
        "no max_new_tokens; vLLM's --generation-config vllm)"
    ),
]
Host = Annotated[str, typer.Option(help="address to listen on (0.0.0.0: all interfaces)")]
Port = Annotated[int, typer.Option(help="TCP port (0: any free port)", min=0, max=65535)]
MaxQueued = Annotated[
    int | None,
    typer.Option(
        help="answer 429 once this many requests wait beyond --max-running-requests (default: no limit)", min=0
    ),
]
MaxLogprobs = Annotated[
    int,
    typer.Option(
        help="the most log-probabilities a request may ask per token: completions' logprobs, chat's top_logprobs "
        "(vLLM's flag; -1: the whole vocabulary)",
        min=-1,
    ),
]
ServedName = Annotated[
    str | None,
    typer.Option(help="the model name clients send as `model` (default: --model, or the embedded model's name)"),
]
Level = Annotated[LogLevel, typer.Option(help="uvicorn log level")]
Origins = Annotated[
    str | None,
    typer.Option(
        help="comma-separated web origins (https://ui.example:3000) whose pages may call the API from a browser, or * "
        "for any: CORS headers and preflight answers for them (default: none)"
    ),
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        envvar=API_KEY_ENV,
        show_default=False,
        help="every /v1 request must send 'Authorization: Bearer <this key>' (401 otherwise; /health and /metrics "
        "stay open); also read from MINISGL_API_KEY, which keeps it out of the process list",
    ),
]
StepLog = Annotated[
    Path | None,
    typer.Option(
        help="record every engine step (time, decode rows, prefill rows and tokens, KV tokens read, the engine's CPU "
        "times) and write them to this file as JSON lines when the server stops (for benchmark runs: the records "
        "stay in memory until then)"
    ),
]


def register(app: typer.Typer) -> None:
    @app.command(short_help="Serve the model over an OpenAI-compatible HTTP API.")
    @with_engine_flags()
    def serve(
        ctx: typer.Context,
        seed: Seed = 0,
        host: Host = "127.0.0.1",
        port: Port = 8000,
        max_queued_requests: MaxQueued = None,
        max_logprobs: MaxLogprobs = MAX_LOGPROBS,
        served_model_name: ServedName = None,
        log_level: Level = LogLevel.info,
        step_log: StepLog = None,
        allowed_origins: Origins = None,
        api_key: ApiKey = None,
        generation_config: GenConfig = GenerationConfig.auto,
        **engine_flags: Any,
    ) -> None:
        """Serve the model over an OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions,
        /v1/responses, /v1/models, /health, /metrics (and SGLang's /generate)."""
        from minisgl_cli.report import check_outputs

        check_outputs(step_log=step_log)  # written when the server stops: a bad path fails now, not after the run
        origins = parse_origins(allowed_origins)
        if api_key is not None and not api_key.strip():
            raise typer.BadParameter("is empty: a client could never send it", param_hint="--api-key")
        config = dataclasses.replace(engine_config(seed=seed, **engine_flags), max_logprobs=max_logprobs)
        refuse_unread_engine_flags(ctx, config)
        # rank 0 serves HTTP: its address is taken before the model loads, so a port in use or a bad --host ends
        # the command at once (exit 2), not after minutes of loading
        listener = bind_listener(host, port) if launcher_rank() == 0 else None
        try:
            defaults = generation_defaults(config.model) if generation_config == GenerationConfig.auto else {}
            llm = load_llm(config)  # under torchrun, ranks > 0 stay in there, following rank 0's steps
            name = served_model_name or engine_flags["model"]
            run_server(
                llm, host, port, name, max_queued_requests, log_level.value, step_log, listener, origins, api_key,
                defaults,
            )  # fmt: skip
        finally:
            if listener is not None:
                listener.close()


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s]+")


def parse_origins(value: str | None) -> tuple[str, ...]:
    """--allowed-origins: origins as a browser sends them (scheme://host[:port], no path), or *."""
    origins = tuple(o.strip() for o in (value or "").split(",") if o.strip())
    for o in origins:
        if o != "*" and not _ORIGIN.fullmatch(o):
            why = f"{o!r} is not an origin (scheme://host[:port], no path, e.g. http://localhost:3000) or *"
            raise typer.BadParameter(why, param_hint="--allowed-origins")
    return origins


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: a free one), for the front end to listen on; exits 2 naming the
    address if it cannot be had (in use, not an address of this machine, a host name that does not resolve)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)  # as uvicorn binds
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses a TIME_WAIT port
        sock.bind((host, port))
        # Hold the port without listening: with SO_REUSEADDR cleared, a second `serve`'s bind fails (EADDRINUSE),
        # and a client connecting during the load is refused at once, as vLLM's, instead of waiting in the backlog
        # for the whole load. The front end sets SO_REUSEADDR again and listens once the engine is up.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    except OSError as e:
        sock.close()
        _cannot_listen(host, port, e)
    return sock


def _cannot_listen(host: str, port: int, e: OSError) -> NoReturn:
    why = e.strerror or str(e)
    hint = "another process listens there: choose another --port" if e.errno == errno.EADDRINUSE else ""
    Console(stderr=True, soft_wrap=True).print(
        f"[red]error:[/red] cannot listen on --host {host} --port {port}: {why}" + (f" ({hint})" if hint else "")
    )
    raise typer.Exit(2) from e


def run_server(
    llm: LLM,
    host: str,
    port: int,
    model_name: str | None = None,
    max_queued_requests: int | None = None,
    log_level: str = "info",
    step_log: Path | None = None,
    listener: socket.socket | None = None,
    allowed_origins: tuple[str, ...] = (),
    api_key: str | None = None,
    sampling_defaults: dict[str, Any] | None = None,
) -> None:
    """Serve `llm` until Ctrl-C / SIGTERM. Exits non-zero if the engine loop crashes or the front end dies.
    listener: host:port already bound (bind_listener); None: the front end binds it. sampling_defaults: what a
    request that leaves a sampling field out gets (the model's generation_config.json)."""
    from engine.engine_loop import engine_info

    fd = None if listener is None else listener.detach()  # serve_engine hands it to the front end, and closes it here
    spec = FrontendSpec(
        llm.config.model, None, host, port, model_name, max_queued_requests, log_level, os.getpid(), fd,
        allowed_origins, sampling_defaults or {},
    )  # fmt: skip
    why = serve_engine(llm.engine, engine_info(llm), spec, step_log, api_key)
    if why:
        Console(stderr=True, soft_wrap=True).print(f"[red]minisgl serve:[/red] {why}; exiting")
        raise typer.Exit(1)


def serve_engine(
    engine: Engine, info: EngineInfo, spec: FrontendSpec, step_log: Path | None = None, api_key: str | None = None
) -> str | None:
    """This process runs the engine loop; the HTTP front end runs in a child process (minisgl_cli.server.frontend)
    until Ctrl-C / SIGTERM here. Returns why it ended, if not by a signal: the loop crashed or the front end died.
    The API key reaches the front end in its environment (API_KEY_ENV), not in its command line for all to see."""
    from engine.ipc import Addresses

    addrs = Addresses.temporary()
    spec = dataclasses.replace(spec, addrs=addrs, engine_pid=os.getpid())
    fds = () if spec.fd is None else (spec.fd,)  # the listening socket, bound here
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV} | ({API_KEY_ENV: api_key} if api_key else {})
    argv = [sys.executable, "-m", "minisgl_cli.server.frontend", spec.to_json()]
    try:
        front = subprocess.Popen(argv, pass_fds=fds, env=env)
    finally:
        if spec.fd is not None:
            # the front end's copy is the only one: once it closes it (told to stop), clients are refused at once
            # instead of waiting in a backlog that nobody accepts from
            os.close(spec.fd)
    return run_beside_front_end(engine, info, addrs, front, "the HTTP front end", step_log).why


@dataclasses.dataclass(frozen=True, slots=True)
class LoopEnd:
    error: str | None  # why the loop crashed
    stopped_by: str | None  # the front end exited (and how); None, with no error: a signal ended it
    front_code: int | None  # the front end's exit code, if it exited by itself
    signum: int | None = None  # the signal that ended the loop, if one did

    @property
    def why(self) -> str | None:
        return self.error or self.stopped_by


STEP_NOTICE_S = 1.5  # the engine still in a step this long after the chat ended says why the terminal waits


def _when_the_front_end_exits(front: subprocess.Popen, loop: EngineLoop, done: threading.Event, say: bool) -> None:
    """Wakes the loop once the front end has exited, so that it ends now instead of at its next look. With `say`
    (the chat's): the loop ends only after its current step, which after a long prompt's prefill on a CPU took 13-16 s
    with nothing on the terminal."""
    front.wait()
    loop.wake()
    if say and not done.wait(STEP_NOTICE_S):
        print(
            "minisgl chat: the engine is ending its current step (a long prompt's prefill can take a while)...",
            file=sys.stderr,
            flush=True,
        )


def run_beside_front_end(
    engine: Engine,
    info: EngineInfo,
    addrs: Addresses,
    front: subprocess.Popen,
    front_name: str,
    step_log: Path | None = None,
    interactive: bool = False,
) -> LoopEnd:
    """Run the engine loop here, at `addrs`, for a front end already started as a child process (`front`, called
    `front_name` in what the loop says; it may connect before the loop binds), until SIGTERM or Ctrl-C, the loop
    crashes or the child exits; then end the child with SIGTERM if it is still there. An `interactive` front end
    (the chat) is a person's: it takes Ctrl-C itself (to stop an answer), and after a crash it stays, showing the
    error, until the person leaves it. A terminal closing (SIGHUP) ends the loop as SIGTERM does, so that the IPC
    directory is removed (the default action killed `serve` on the spot and left it in /tmp)."""
    from engine.engine_loop import EngineLoop

    try:
        loop = EngineLoop(engine, addrs, info)
    except BaseException:  # its sockets did not bind: neither the front end nor the IPC directory may outlive it
        stop_process(front)
        addrs.remove()
        raise
    if step_log is not None:
        engine.step_records = []
    caught: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        caught.append(signum)
        loop.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN if interactive else stop)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup's choice stands
        signal.signal(signal.SIGHUP, stop)

    # Under torchrun the ranks run in sessions of their own: a launcher killed outright (SIGKILL, the OOM killer)
    # left them serving for good. Rank 0 leaves once its launcher is gone, and its shutdown broadcast ends the rest.
    launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None

    def front_end_exited() -> str | None:
        if launcher is not None and os.getppid() != launcher:
            return f"the torchrun launcher (pid {launcher}) exited"
        code = front.poll()
        return None if code is None else f"{front_name} exited ({_exit_status(code)})"

    done = threading.Event()
    # the chat's person waits at the terminal the chat gave back: a step outlasting it is not a hang
    threading.Thread(target=_when_the_front_end_exits, args=(front, loop, done, interactive), daemon=True).start()
    try:
        loop.run(watch=front_end_exited)
        if loop.error and interactive:
            front.wait()
        elif loop.error:  # the front end fails open requests and answers 503 meanwhile
            time.sleep(ORPHAN_GRACE_S)
    finally:
        code = front.poll()
        stop_process(front)
        done.set()
        loop.close()
        addrs.remove()
        if step_log is not None:
            from engine.step_log import write_step_log

            write_step_log(engine.step_records or [], step_log)
    return LoopEnd(loop.error, loop.stopped_by, code, caught[0] if caught else None)


def _exit_status(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
