"""The project's one streaming client for OpenAI-compatible servers (the benchmarks' and the chat's): a small HTTP/1.1
client on asyncio streams with a keep-alive pool, SSE parsed from raw byte chunks, and only the fields they need
decoded from each event.

Why not httpx: with one SSE event per socket write (what real servers send), httpx's per-read overhead (h11 and its
stream layers) held a client to ~14,000 events/s on the project's 2-core CPU machine, this one to ~80,000
(`minisgl bench-serve --client-check` measures it anywhere). Plain http:// and https://; no proxies, no HTTP/2.

    async with OpenAIClient("http://127.0.0.1:8000") as client:
        async for ev in client.stream("/v1/completions", {"model": m, "prompt": "Hi", "stream": True}):
            print(ev.time, ev.text, ev.usage)
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]  # the C string scanner; not in typeshed
from typing import Any
from urllib.parse import urlsplit


@dataclass(slots=True)
class Event:
    time: float  # perf_counter when the bytes carrying it arrived
    text: str  # delta text; "" for role, finish and usage chunks
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    reasoning: str = ""  # `reasoning_content` / `reasoning` of servers that split thinking off


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes):
        self.status, self.body = status, body
        if status in (401, 403):  # every command with a --url reads a key from --api-key or OPENAI_API_KEY
            super().__init__(f"HTTP {status}: {self.message} (pass the server's key: --api-key, or OPENAI_API_KEY)")
        else:
            super().__init__(f"HTTP {status}: {body.decode(errors='replace')[:300]}")

    @property
    def code(self) -> str | None:
        """The `code` of an OpenAI-shaped error body (e.g. "context_length_exceeded"), if it has a string one."""
        try:
            err = json.loads(self.body)
        except ValueError:
            return None
        err = err.get("error", err) if isinstance(err, dict) else err
        code = err.get("code") if isinstance(err, dict) else None
        return code if isinstance(code, str) else None

    @property
    def message(self) -> str:
        """The server's own words: the `message` of an OpenAI-shaped error body, else the body's start."""
        try:
            err = json.loads(self.body)
            err = err.get("error", err) if isinstance(err, dict) else err
            return str(err.get("message", err) if isinstance(err, dict) else err)
        except ValueError:
            return self.body.decode(errors="replace").strip()[:300] or "(empty body)"


class StreamError(Exception):
    """The server reported an error inside the stream, or the stream ended before `data: [DONE]`."""


def api_base(url: str) -> str:
    """'http://host:port', '.../v1' or '.../v1/' -> 'http://host:port/v1'."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def decode_event(payload: bytes) -> tuple[str, str, dict[str, Any] | None, str | None]:
    """(text, reasoning, usage, finish_reason) of one `data:` payload. A plain token chunk (finish_reason null, no
    usage, no error, no reasoning) has only its text string decoded; anything else goes through json.loads (3.5x
    slower per event)."""
    s = payload.decode()
    if '"error"' not in s and '"usage":{' not in s and '"usage": {' not in s and '"reasoning' not in s:
        if '"finish_reason":null' in s or '"finish_reason": null' in s:
            i, n = s.find('"text":'), 7
            if i < 0:
                i, n = s.find('"content":'), 10
            if i >= 0:
                i += n
                while s[i] == " ":
                    i += 1
                return (scanstring(s, i + 1)[0] if s[i] == '"' else ""), "", None, None
    obj = json.loads(s)
    if not isinstance(obj, dict):
        raise StreamError(f"unexpected event {s[:200]}")
    if obj.get("error"):
        err = obj["error"]
        raise StreamError(f"server error: {err.get('message', err) if isinstance(err, dict) else err}")
    text, reasoning, finish = "", "", None
    if choices := obj.get("choices"):
        c = choices[0]
        delta = c.get("delta") or {}
        text = c.get("text") or delta.get("content") or ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        finish = c.get("finish_reason")
    return text, reasoning, obj.get("usage"), finish


class OpenAIClient:
    """One client per event loop; any number of concurrent requests (each on its own pooled connection)."""

    def __init__(self, url: str, timeout: float = 600.0, api_key: str | None = None):
        base = urlsplit(api_base(url))
        if base.scheme not in ("http", "https") or not base.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        if base.username is not None or base.password is not None:  # went into the Host header and the results
            raise ValueError(
                f"{base.scheme}://{base.hostname}...: a user or password in the URL is not sent by this client; give"
                " the server's key with --api-key (or OPENAI_API_KEY)"
            )
        self.url = url
        self.host = base.hostname
        self.port = base.port or (443 if base.scheme == "https" else 80)
        self.root = base.path.removesuffix("/v1")  # a server mounted under a path prefix
        self.timeout = timeout
        self._ssl = ssl.create_default_context() if base.scheme == "https" else None
        self._headers = f"Host: {base.netloc}\r\nUser-Agent: minisgl-bench\r\nAccept: */*\r\n"
        if api_key:
            self._headers += f"Authorization: Bearer {api_key}\r\n"
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    # ---- requests ------------------------------------------------------------------------------------------
    async def get(self, path: str) -> tuple[int, bytes]:
        """GET root + path (e.g. '/v1/models', '/metrics'): status and body."""
        async with asyncio.timeout(self.timeout):
            return await self._request("GET", path, None)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        async with asyncio.timeout(self.timeout):
            return await self._request("POST", path, json.dumps(body).encode())

    async def models(self) -> list[dict[str, Any]]:
        """/v1/models' entries (`id`, and `owned_by` where the server says)."""
        status, body = await self.get("/v1/models")
        if status != 200:
            raise HTTPStatusError(status, body)
        return list(json.loads(body).get("data") or [])

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncGenerator[Event]:
        """POST a streaming request; one Event per SSE data event until `data: [DONE]`. A non-200 answer raises
        HTTPStatusError, an error event or a stream cut short StreamError. Close it with contextlib.aclosing when
        leaving early, so its connection is dropped at once. The caller bounds the whole request's time."""
        reader, writer = await self._send("POST", path, json.dumps(body).encode())
        reusable = False
        try:
            status, headers = await _read_head(reader)
            if status != 200:
                raise HTTPStatusError(status, await _read_body(reader, headers))
            buf, done = b"", False
            async for now, data in _body_pieces(reader, headers):
                if done:  # after [DONE]: read on to the body's end so the connection can be reused
                    continue
                buf += data
                if b"\r" in buf:  # CRLF line ends (sse-starlette)
                    buf = buf.replace(b"\r\n", b"\n")
                if b"\n\n" not in buf:
                    continue
                *blocks, buf = buf.split(b"\n\n")
                for block in blocks:
                    payload = _data_of(block)
                    if payload is None:
                        continue
                    if payload == b"[DONE]":
                        done = True
                        break
                    text, reasoning, usage, finish = decode_event(payload)
                    yield Event(now, text, usage, finish, reasoning)
            if not done:
                raise StreamError("the stream ended before data: [DONE]")
            reusable = _keep_alive(headers)
        finally:
            if reusable:
                self._idle.append((reader, writer))
            else:
                writer.close()

    # ---- connection handling ---------------------------------------------------------------------------------
    async def _request(self, method: str, path: str, payload: bytes | None) -> tuple[int, bytes]:
        reader, writer = await self._send(method, path, payload)
        try:
            status, headers = await _read_head(reader)
            body = await _read_body(reader, headers)
        except BaseException:
            writer.close()
            raise
        if _keep_alive(headers):
            self._idle.append((reader, writer))
        else:
            writer.close()
        return status, body

    async def _send(self, method: str, path: str, payload: bytes | None):
        head = f"{method} {self.root}{path} HTTP/1.1\r\n{self._headers}"
        if payload is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        data = (head + "\r\n").encode() + (payload or b"")
        while self._idle:  # a pooled connection the server closed meanwhile shows up as EOF: try the next
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            writer.write(data)
            return reader, writer
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self._ssl, limit=1 << 20)
        except OSError as e:
            raise ConnectionError(f"cannot connect to {self.host}:{self.port}: {e.strerror or e}") from e
        writer.write(data)
        return reader, writer


def _data_of(block: bytes) -> bytes | None:
    """The data of one SSE event block (its `data:` lines joined), None for comments and data-less events."""
    if block.startswith(b"data: ") and b"\n" not in block:
        return block[6:]
    lines = [ln[5:].removeprefix(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        raise ConnectionError("the server closed the connection without answering") from e
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not (parts[1].isascii() and parts[1].isdigit()):
        raise ConnectionError(f"not an HTTP response: {lines[0][:100]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
    if parts[0] == "HTTP/1.0" and "keep-alive" not in headers.get("connection", "").lower():
        headers.setdefault("connection", "close")
    return int(parts[1]), headers


def _keep_alive(headers: dict[str, str]) -> bool:
    framed = "chunked" in headers.get("transfer-encoding", "") or "content-length" in headers
    return framed and headers.get("connection", "").lower() != "close"


async def _body_pieces(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[tuple[float, bytes]]:
    """The body in the pieces the network delivered, de-chunked, each with its arrival time."""
    if "chunked" in headers.get("transfer-encoding", ""):
        buf = b""
        while True:
            data = await reader.read(1 << 18)
            now = time.perf_counter()
            if not data:
                raise StreamError("the connection closed in the middle of the response")
            buf += data
            out: list[bytes] = []
            pos = 0
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(buf[pos:eol].split(b";")[0], 16)
                if size == 0:  # the last chunk; a trailer section would end in one more CRLF
                    if buf.endswith(b"\r\n\r\n", eol):
                        yield now, b"".join(out)
                        return
                    break
                if len(buf) < eol + 2 + size + 2:
                    break
                out.append(buf[eol + 2 : eol + 2 + size])
                pos = eol + 2 + size + 2
            buf = buf[pos:]
            if out:
                yield now, b"".join(out)
    elif (length := headers.get("content-length")) is not None:
        left = int(length)
        while left > 0:
            data = await reader.read(min(left, 1 << 18))
            if not data:
                raise StreamError("the connection closed in the middle of the response")
            left -= len(data)
            yield time.perf_counter(), data
    else:
        while data := await reader.read(1 << 18):
            yield time.perf_counter(), data


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    return b"".join([d async for _, d in _body_pieces(reader, headers)])
