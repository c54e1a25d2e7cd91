"""A real `minisgl serve` app on a free loopback port (uvicorn in a background thread) for the server tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn
from openai import AsyncOpenAI, OpenAI

from engine.async_llm import AsyncLLM
from engine.llm import LLM
from engine.metrics import EngineMetrics
from minisgl_cli.server import create_app
from minisgl_cli.server.engine_client import EngineClient


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    async_llm: AsyncLLM
    client: EngineClient  # the app's view of the engine (in-flight count, server metrics)

    @property
    def model(self) -> str:
        return self.client.model_name

    def openai(self, **kw) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120, **kw)

    def async_openai(self, **kw) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120, **kw)

    def engine_metrics(self) -> EngineMetrics:
        return self.async_llm.call(lambda llm: llm.metrics())

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
    async_llm = AsyncLLM(llm)
    app = create_app(async_llm, **app_kw)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield LiveServer(f"http://127.0.0.1:{sock.getsockname()[1]}", async_llm, app.state.client)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        async_llm.shutdown()
        sock.close()
