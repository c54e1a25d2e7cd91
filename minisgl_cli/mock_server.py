"""A mock OpenAI-compatible streaming server with latencies you set, on raw asyncio (no framework in the way).

Two uses: a trivial SSE server that streams pre-encoded events as fast as the socket takes them (many per write),
to measure how many events per second the benchmark client absorbs; and a server whose TTFT, time per output token,
capacity and failures are known, to check that the benchmarks measure what it was told to do.
    python -m minisgl_cli.mock_server --port 8300 --ttft 0.05 --tpot 0.01 --capacity 8
    python -m minisgl_cli.mock_server --port 8300 --fail-every 4     # every 4th request gets HTTP 500
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from minisgl_cli.child_process import stop_process


@dataclass(slots=True)
class MockConfig:
    ttft: float = 0.0  # seconds from the request (or from a free slot, with capacity) to the first token
    tpot: float = 0.0  # seconds between output tokens; 0: as fast as the socket takes them
    events_per_write: int = 64  # events per socket write when tpot is 0
    capacity: int = 0  # streams served at once (0: unlimited); later requests wait for a slot
    fail_from: int = 0  # requests numbered from this one (1-based) get HTTP 500 (0: never)
    fail_every: int = 0  # every k-th request (numbers k, 2k, ...) gets HTTP 500 (0: never): a known share 1/k fails,
    # as an overloaded server fails some requests and serves the rest
    cut_from: int = 0  # streams numbered from this one close the connection after 2 tokens (0: never)
    blank_from: int = 0  # streams numbered from this one make tokens with no text (special tokens, as a real server
    # sends them: no event of their own, then the finish chunk with empty text; 0: never)
    model: str = "mock"
    more_models: str = ""  # more ids /v1/models lists after `model`, comma-separated (a server of several models)
    known_stream_options: str = ""  # the stream_options keys it takes, comma-separated: another is refused with a 400
    # naming it, as a server that checks its fields strictly ("": any is taken, and ignored but include_usage)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class MockServer:
    def __init__(self, cfg: MockConfig):
        self.cfg = cfg
        self.requests = 0
        self.slots = asyncio.Semaphore(cfg.capacity) if cfg.capacity else None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                await self.route(method, path.split("?")[0], body, writer)
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def reply(self, writer: asyncio.StreamWriter, status: int, obj: dict | str) -> None:
        body = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
        kind = b"text/plain" if isinstance(obj, str) else b"application/json"
        reason = {200: b"OK", 404: b"Not Found", 500: b"Internal Server Error"}.get(status, b"Error")
        writer.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason, kind, len(body), body)
        )
        await writer.drain()

    async def route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        if method == "GET" and path == "/health":
            return await self.reply(writer, 200, {"status": "ok"})
        if method == "GET" and path == "/v1/models":
            ids = [self.cfg.model, *filter(None, self.cfg.more_models.split(","))]
            return await self.reply(
                writer, 200, {"object": "list", "data": [{"id": m, "owned_by": "mock"} for m in ids]}
            )
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return await self.reply(writer, 404, {"error": {"message": f"no route {method} {path}"}})
        self.requests += 1
        n = self.requests
        cfg = self.cfg
        if (cfg.fail_from and n >= cfg.fail_from) or (cfg.fail_every and n % cfg.fail_every == 0):
            return await self.reply(writer, 500, {"error": {"message": f"mock failure of request {n}"}})
        req = json.loads(body)
        known = set(filter(None, cfg.known_stream_options.split(",")))
        unknown = sorted(set(req.get("stream_options") or {}) - known) if known else []
        if unknown:
            why = f"Unrecognized request argument supplied: stream_options.{unknown[0]}"
            return await self.reply(writer, 400, {"error": {"message": why, "type": "invalid_request_error"}})
        chat = path.endswith("chat/completions")
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        prompt = req.get("prompt") if not chat else " ".join(m["content"] for m in req["messages"])
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        model = str(req.get("model") or self.cfg.model)  # answered as the model asked for, as a server of several
        if self.slots is None:
            await self.stream(writer, chat, max_tokens, prompt_tokens, bool(req.get("stream")), n, model)
        else:
            async with self.slots:
                await self.stream(writer, chat, max_tokens, prompt_tokens, bool(req.get("stream")), n, model)

    async def stream(
        self, writer: asyncio.StreamWriter, chat: bool, n_out: int, n_in: int, stream: bool, number: int, model: str
    ) -> None:
        cfg = self.cfg
        start = time.perf_counter()
        kind = "chat.completion.chunk" if chat else "text_completion"
        env = {"id": f"mock-{number}", "object": kind, "created": 0, "model": model}

        def choice(text: str, finish: str | None) -> dict:
            body = {"delta": {"content": text} if text else {}} if chat else {"text": text}
            return {"index": 0, **body, "logprobs": None, "finish_reason": finish}

        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        if not stream:
            await asyncio.sleep(cfg.ttft + cfg.tpot * (n_out - 1))
            return await self.reply(writer, 200, {**env, "choices": [choice(" tok" * n_out, "length")], "usage": usage})
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        token = _event({**env, "choices": [choice(" tok", None)]})
        tail = _event({**env, "choices": [choice("", "length")]}) + _event({**env, "choices": [], "usage": usage})
        tail += b"data: [DONE]\n\n"
        cut = cfg.cut_from and number >= cfg.cut_from
        if cfg.blank_from and number >= cfg.blank_from:
            token = b""
        sent = 0
        if cfg.ttft:
            await asyncio.sleep(max(0.0, start + cfg.ttft - time.perf_counter()))
        while sent < n_out:
            if cut and sent >= 2:
                writer.transport.abort()
                return
            if cfg.tpot:  # every token due by now (a late wake-up sends the backlog at once)
                due = min(n_out, 1 + int((time.perf_counter() - start - cfg.ttft) / cfg.tpot))
                k = max(1, due - sent)
            else:
                k = min(cfg.events_per_write, n_out - sent)
            sent += k
            if token:
                writer.write(_chunk(token * k))
                await writer.drain()
            if cfg.tpot and sent < n_out:
                await asyncio.sleep(max(0.0, start + cfg.ttft + sent * cfg.tpot - time.perf_counter()))
        writer.write(_chunk(tail) + b"0\r\n\r\n")
        await writer.drain()


async def serve(cfg: MockConfig, host: str, port: int, ready: str | None = None) -> None:
    server = await asyncio.start_server(MockServer(cfg).handle, host, port, backlog=4096)
    if ready:
        print(ready, flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def mock_server_process(cfg: MockConfig, port: int) -> Iterator[str]:
    """Runs the mock in a child process (so it does not share this process's CPU time with the client); yields
    its URL and stops it on exit."""
    args = [sys.executable, "-m", "minisgl_cli.mock_server", "--port", str(port), "--ready", "READY"]
    for k, v in asdict(cfg).items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""  # READY, or '' when it died
        if line.strip() != "READY":
            rest = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"the mock server did not start: {line}{rest}".strip())
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--ready", default=None, help="print this line once listening")
    for name, value in asdict(MockConfig()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    a = vars(p.parse_args(argv))
    host, port, ready = a.pop("host"), a.pop("port"), a.pop("ready")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(MockConfig(**a), host, port, ready))


if __name__ == "__main__":
    main()
