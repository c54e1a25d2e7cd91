"""How many streamed tokens per second the benchmark client absorbs: the project's OpenAI client (the code bench-serve
and bench-trace --url time requests with) against the trivial mock server in a child process, which streams
pre-encoded one-token events, many per write, so that the server is not the limit. A run compares its own token rate
with this figure to say whether the client, not the server, was its limit."""

from __future__ import annotations

import asyncio
import socket
import time
from contextlib import aclosing
from dataclasses import asdict, dataclass
from typing import Any

from minisgl_cli.mock_server import MockConfig, mock_server_process
from minisgl_cli.openai_client import OpenAIClient
from minisgl_cli.replay import ReplayItem, drive, url_sender


@dataclass(slots=True)
class ClientCheck:
    streams: int
    tokens_per_stream: int
    events_per_write: int
    events: int
    seconds: float

    @property
    def tok_per_s(self) -> float:
        return self.events / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tok_per_s": self.tok_per_s}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def absorb(url: str, streams: int, tokens: int) -> tuple[int, float]:
    """Events received and seconds taken by `streams` concurrent streams of `tokens` one-token events each, through
    the same sender a benchmark run uses (timing, usage, counters included)."""
    async with OpenAIClient(url, timeout=120) as client:
        # one request per stream first, so the timed run reuses warm pooled connections as a long run does
        await asyncio.gather(*(_one(client) for _ in range(streams)))
        items = [ReplayItem(i, 0, 0.0, [1, 2, 3], tokens) for i in range(streams)]
        t0 = time.perf_counter()
        results = await drive(items, url_sender(client, "mock", 0.0))
        seconds = time.perf_counter() - t0
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"the client check's streams failed: {failed[0]}")
    return sum(len(r.itls) + 1 for r in results), seconds


async def _one(client: OpenAIClient) -> None:
    body = {"model": "mock", "prompt": [1], "max_tokens": 2, "stream": True}
    async with aclosing(client.stream("/v1/completions", body)) as events:
        async for _ in events:
            pass


def check_client(streams: int = 128, tokens: int = 1000, events_per_write: int = 16, repeats: int = 2) -> ClientCheck:
    """The best of `repeats` runs (a shared machine's other work only ever slows a run down)."""
    with mock_server_process(MockConfig(events_per_write=events_per_write), _free_port()) as url:
        best = min((asyncio.run(absorb(url, streams, tokens)) for _ in range(repeats)), key=lambda x: x[1])
    return ClientCheck(streams, tokens, events_per_write, best[0], best[1])


def client_check_or_none(quiet: bool = False) -> ClientCheck | None:
    """A short check before a --url run (about a second); a failure to measure is a warning, not the run's end."""
    from rich.console import Console

    console = Console(stderr=True)
    try:
        if quiet:
            return check_client(tokens=500, repeats=1)
        with console.status("measuring the client's absorption rate (--no-client-check skips it)"):
            return check_client(tokens=500, repeats=1)
    except Exception as e:  # noqa: BLE001 - reported, and the run goes on without the figure
        console.print(f"[yellow]warning:[/yellow] could not measure the client's absorption rate: {e}")
        return None
