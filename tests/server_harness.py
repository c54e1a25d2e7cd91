"""A real `minisgl serve` on a free loopback port for the server tests: the same engine loop, ZeroMQ pipes, front end
and HTTP server as the command, with the engine loop in a thread of the test process instead of a process of its
own, so tests can reach into the engine (faults, invariant checks). tests/test_serve_process.py runs the command."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from openai import AsyncOpenAI, OpenAI

from engine.engine import Engine
from engine.engine_loop import EngineLoop, engine_info
from engine.ipc import Addresses
from engine.llm import LLM
from engine.metrics import EngineMetrics
from engine.remote_llm import RemoteLLM
from minisgl_cli.server.app import create_app
from minisgl_cli.server.engine_client import EngineClient
from minisgl_cli.server.frontend import HTTPServer, serve_http


class InspectableLoop(EngineLoop):
    """The engine loop, plus calls run on its thread between steps (a consistent view for assertions)."""

    IDLE_TICK = 0.02

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.calls: queue.Queue[tuple[Callable[[Engine], Any], queue.Queue[Any]]] = queue.Queue()

    def call(self, fn: Callable[[Engine], Any], timeout: float = 30.0) -> Any:
        """fn(engine) run on the loop's thread between steps; its result, or its exception raised here."""
        box: queue.Queue[Any] = queue.Queue()
        self.calls.put((fn, box))
        ok, value = box.get(timeout=timeout)
        if not ok:
            raise value
        return value

    def _receive(self, block: bool) -> None:
        super()._receive(block)
        while not self.calls.empty():
            fn, box = self.calls.get()
            try:
                box.put((True, fn(self.engine)))
            except Exception as e:
                box.put((False, e))


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    llm: LLM  # the engine side: its tokenizer, and methods to inject faults into
    engine_loop: InspectableLoop
    remote: RemoteLLM  # the front end's handle on the engine
    client: EngineClient  # the app's view of the engine (in-flight count, server metrics)
    event_loop: asyncio.AbstractEventLoop  # the front end's

    @property
    def model(self) -> str:
        return self.client.model_name

    def openai(self, **kw) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120, **kw)

    def async_openai(self, **kw) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120, **kw)

    def on_engine(self, fn: Callable[[Engine], Any], timeout: float = 30.0) -> Any:
        """fn(engine) run on the engine loop's thread between steps."""
        return self.engine_loop.call(fn, timeout)

    def live_requests(self) -> int:
        """Requests the engine still holds, after checking its page accounting (on its thread)."""

        def check(engine: Engine) -> int:
            engine.check()
            return len(engine.reqs)

        return int(self.on_engine(check))

    def engine_metrics(self) -> EngineMetrics:
        return self.on_engine(lambda engine: engine.metrics())

    def wait_idle(self, timeout: float = 20.0) -> EngineMetrics:
        """Poll until no request is left anywhere (server, scheduler, KV pages); return the engine metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.engine_metrics()
            idle = m.running == 0 and m.waiting == 0 and m.kv_pages_in_use == 0 and self.client.in_flight == 0
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.05)


@contextlib.contextmanager
def live_server(llm: LLM, **app_kw) -> Iterator[LiveServer]:
    addrs = Addresses.temporary()
    engine_loop = InspectableLoop(llm.engine, addrs, engine_info(llm))
    engine_thread = threading.Thread(target=engine_loop.run, name="engine-loop", daemon=True)
    engine_thread.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    ready: queue.Queue[Any] = queue.Queue()

    async def front_end() -> None:
        remote = RemoteLLM(llm.tokenizer, addrs)
        try:
            await remote.start(timeout=30)
            app = create_app(remote, **app_kw)
            server = HTTPServer(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
            ready.put((remote, app.state.client, server, asyncio.get_running_loop()))
            await serve_http(remote, server, [sock])
        except BaseException as e:
            ready.put(e)
            raise
        finally:
            remote.close()

    http_thread = threading.Thread(target=asyncio.run, args=(front_end(),), name="front-end", daemon=True)
    http_thread.start()
    got = ready.get(timeout=60)
    if isinstance(got, BaseException):
        raise got
    remote, client, server, event_loop = got
    deadline = time.monotonic() + 30
    while not server.started:
        assert http_thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield LiveServer(f"http://127.0.0.1:{sock.getsockname()[1]}", llm, engine_loop, remote, client, event_loop)
    finally:
        server.should_exit = True
        http_thread.join(timeout=15)
        engine_loop.stop()
        engine_thread.join(timeout=15)
        engine_loop.close()
        addrs.remove()
        sock.close()
