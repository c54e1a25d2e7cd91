"""The HTTP front end's process: tokenizer, FastAPI app and uvicorn, talking to the engine process over ZeroMQ.
`minisgl serve` (the engine process; rank 0 under torchrun) starts it as its child and ends it with SIGTERM.
If the engine process disappears, open requests end with an error, /health answers 503 for a moment, and this
process exits non-zero."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator

import uvicorn

from engine.gc_heap import collect_if_idle, frozen_heap
from engine.remote_llm import RemoteLLM
from minisgl_cli.process_exit import exit_now
from minisgl_cli.server.app import create_app
from minisgl_cli.server.frontend_spec import API_KEY_ENV, ENGINE_GONE_EXIT, ORPHAN_GRACE_S, FrontendSpec

IDLE_CHECK_S = 0.5
TERM_GRACE_S = 5.0  # after a SIGTERM, how long open requests wait for the engine to end them


class HTTPServer(uvicorn.Server):
    """uvicorn without signal handlers of its own: whoever runs it decides when it ends (should_exit)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(
    remote: RemoteLLM,
    server: HTTPServer,
    sockets: list[socket.socket] | None = None,
    engine_pid: int | None = None,
    on_sigterm: bool = False,
) -> int:
    """Run the HTTP server until told to exit; returns the exit code. With engine_pid, watch that the engine
    process (our parent) lives: once it is gone, fail every open request and exit with ENGINE_GONE_EXIT. With
    on_sigterm (the main thread's loop), SIGTERM ends it."""
    code = 0

    async def watch() -> None:
        nonlocal code
        while os.getppid() == engine_pid:
            await asyncio.sleep(0.2)
        why = f"the engine process (pid {engine_pid}) exited"
        remote.fail_all(why)
        print(f"minisgl serve: {why}; open requests ended with an error; the HTTP front end exits", file=sys.stderr)
        await asyncio.sleep(ORPHAN_GRACE_S)
        code, server.should_exit = ENGINE_GONE_EXIT, True

    async def collect_when_idle() -> None:
        while True:
            await asyncio.sleep(IDLE_CHECK_S)
            collect_if_idle(bool(remote.pending))

    async def end_on_sigterm() -> None:
        """The engine ends this process with SIGTERM once it has told open requests why it stops. A SIGTERM from
        elsewhere (torchrun's, to rank 0's whole process group) comes while requests are open: the engine's word is
        awaited a while, and if it does not come (rank 0 stopped or stuck), the requests end with an error here.
        uvicorn otherwise cut their streams after its 2 s without one, and the IPC directory stayed in /tmp."""
        nonlocal code
        # Stop taking new work at once, as uvicorn's own shutdown does: close the listening sockets (a load balancer
        # fails over, a client is refused instead of being accepted and cut 5 s later), end idle keep-alive
        # connections and let busy ones close after their response.
        for listening in getattr(server, "servers", []):
            listening.close()
        for connection in list(getattr(server.server_state, "connections", ())):
            connection.shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TERM_GRACE_S
        while remote.pending and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if remote.pending:
            why = f"the HTTP front end was stopped (SIGTERM) and the requests did not end within {TERM_GRACE_S:.0f} s"
            remote.fail_all(why)
            print(f"minisgl serve: {why}; open requests ended with an error", file=sys.stderr, flush=True)
            code = ENGINE_GONE_EXIT
        server.should_exit = True

    ending: list[asyncio.Task[None]] = []

    def sigterm() -> None:
        if not ending:  # a second SIGTERM changes nothing
            ending.append(asyncio.create_task(end_on_sigterm()))

    if on_sigterm:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, sigterm)
    watcher = asyncio.create_task(watch()) if engine_pid is not None else None
    # The front end's full collections go as the engine loop's (engine/gc_heap.py): its start-up heap (imports,
    # tokenizer, app) is frozen, and full passes wait until no request is open. Under issue #15's replay an automatic
    # full pass here took ~200 ms, with every stream's tokens waiting behind it (docs/serve.md).
    with frozen_heap():
        collector = asyncio.create_task(collect_when_idle())
        try:
            await server.serve(sockets)
        finally:
            collector.cancel()
            if watcher is not None:
                watcher.cancel()
    return code


async def _main(spec: FrontendSpec) -> int:
    from rich.console import Console

    from engine.tokenizer import load_tokenizer

    assert spec.addrs is not None
    remote = RemoteLLM(load_tokenizer(spec.model), spec.addrs)
    info = await remote.start()
    api_key = os.environ.pop(API_KEY_ENV, None)
    app = create_app(
        remote, spec.model_name, spec.max_queued_requests, spec.allowed_origins, api_key, spec.sampling_defaults
    )
    server = HTTPServer(
        uvicorn.Config(
            app, host=spec.host, port=spec.port, log_level=spec.log_level, lifespan="off", timeout_graceful_shutdown=2
        )
    )
    # the socket the command bound before loading the model (its port is the real one when --port was 0)
    sockets = None if spec.fd is None else [socket.socket(fileno=spec.fd)]
    if sockets is not None:
        try:  # the command only bound it (a client during the load is refused); uvloop would swallow a failure
            sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sockets[0].listen(2048)
        except OSError as e:
            print(f"minisgl serve: cannot listen on {spec.host}:{spec.port}: {e.strerror or e}", file=sys.stderr)
            return 2
    host, port = (spec.host, spec.port) if sockets is None else sockets[0].getsockname()[:2]
    Console(stderr=True, soft_wrap=True).print(
        f"[bold]minisgl serve[/bold]: model [cyan]{app.state.client.model_name}[/cyan] on {info.device} "
        f"({info.dtype}, {info.attention} attention, tp={info.tp}) at http://{_url_host(host)}:{port}/v1"
    )
    if spec.sampling_defaults:
        given = ", ".join(f"{k} {v}" for k, v in spec.sampling_defaults.items())
        Console(stderr=True, soft_wrap=True).print(
            f"sampling defaults from the model's generation_config.json: {given} (--generation-config none: the API's)"
        )
    code = 1
    try:
        code = await serve_http(remote, server, sockets, engine_pid=spec.engine_pid, on_sigterm=True)
        return code
    finally:
        remote.close()
        if code == ENGINE_GONE_EXIT:  # the engine died without its own cleanup (SIGKILL, OOM, os._exit of a failed
            spec.addrs.remove()  # TP group) or does not answer: its IPC directory would stay in /tmp for good


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def main() -> None:
    # Ctrl-C reaches the whole process group, and so does SIGHUP (the terminal closing; torchrun forwards the
    # signals it gets to each rank's process group); the engine process acts on them and ends this one with SIGTERM
    # once open requests have been told. (SIGHUP's default action ended this process at once: every open client
    # saw its connection dropped instead of the error event / 503.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    spec = FrontendSpec.from_json(sys.argv[1])
    try:  # uvloop where installed, as uvicorn itself would pick: the front end's hot path is the event loop
        import uvloop
    except ImportError:
        exit_now(asyncio.run(_main(spec)))
    exit_now(uvloop.run(_main(spec)))


if __name__ == "__main__":
    main()
