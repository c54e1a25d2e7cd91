"""A small async client for OpenAI-compatible chat servers (over httpx): stream a chat completion as timed deltas,
list the served models, fetch /metrics. Kept narrow so another transport can stand in for it."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx


class RemoteError(Exception):
    """The server refused the request (status set: 4xx/5xx), failed mid-answer, or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Delta:
    """One streamed chunk. time: time.perf_counter() when it arrived."""

    time: float
    content: str = ""
    reasoning: str = ""  # `reasoning_content` / `reasoning` of servers that split thinking off
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None  # the final usage chunk (stream_options.include_usage)


def split_url(url: str) -> tuple[str, str]:
    """(server root, API base ending in /v1) from either form."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--url must start with http:// or https:// (got {url!r})")
    root = url.removesuffix("/v1")
    return root, root + "/v1"


def _error_text(body: bytes) -> str:
    try:
        err = json.loads(body)
        err = err.get("error", err) if isinstance(err, dict) else err
        return str(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        return body.decode(errors="replace").strip()[:300] or "(empty body)"


class OpenAIChatClient:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.root, self.base = split_url(url)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(timeout, connect=10.0)
        self._client: httpx.AsyncClient | None = None  # made on first use, on the loop that uses it

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(headers=self.headers, timeout=self.timeout)
        return self._client

    def models(self) -> list[dict[str, Any]]:
        """GET /v1/models (blocking: for start-up, before any event loop)."""
        try:
            r = httpx.get(self.base + "/models", headers=self.headers, timeout=10.0)
        except httpx.HTTPError as e:
            raise RemoteError(f"cannot reach {self.base}: {e}") from e
        if r.status_code != 200:
            raise RemoteError(f"{self.base}/models answered {r.status_code}: {_error_text(r.content)}", r.status_code)
        data = r.json().get("data")
        if not isinstance(data, list):
            raise RemoteError(f"{self.base}/models: no model list in the answer")
        return data

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[Delta]:
        """POST /v1/chat/completions with stream=true; yields each chunk's delta. RemoteError on any failure,
        including an error event mid-stream or a stream that ends without a finish_reason."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        finished = False
        try:
            async with self.client.stream("POST", self.base + "/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RemoteError(f"server answered {r.status_code}: {_error_text(await r.aread())}", r.status_code)
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise RemoteError(f"server error: {_error_text(data.encode())}")
                    now = time.perf_counter()
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        reason = choice.get("finish_reason")
                        finished = finished or reason is not None
                        yield Delta(
                            now,
                            delta.get("content") or "",
                            delta.get("reasoning_content") or delta.get("reasoning") or "",
                            reason,
                        )
                    if chunk.get("usage"):
                        yield Delta(now, usage=chunk["usage"])
        except httpx.HTTPError as e:
            raise RemoteError(f"lost the server: {type(e).__name__}: {e}") from e
        except ValueError as e:  # json
            raise RemoteError(f"bad stream from the server: {e}") from e
        if not finished:
            raise RemoteError("the server ended the stream before the answer finished")

    async def metrics_text(self) -> str | None:
        """GET /metrics; None when the server has none (or cannot be reached now)."""
        try:
            r = await self.client.get(self.root + "/metrics", timeout=5.0)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
