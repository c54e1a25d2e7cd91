"""The chat's side of an OpenAI-compatible server: stream a chat completion as timed deltas, list the served models,
fetch /metrics. The HTTP and SSE work is the project's one client (minisgl_cli/openai_client.py); this adds the chat's
request shape and turns every failure into a RemoteError the chat can show."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from minisgl_cli.openai_client import HTTPStatusError, OpenAIClient, StreamError, api_base

CONNECT_TIMEOUT = 10.0  # seconds for the model list at start-up
METRICS_TIMEOUT = 5.0


class RemoteError(Exception):
    """The server refused the request (status set: 4xx/5xx), failed mid-answer, or could not be reached."""

    def __init__(self, message: str, status: int | None = None, too_long: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.too_long = too_long  # the prompt plus max_tokens is over the server's context (a 400 that says so)


@dataclass(frozen=True, slots=True)
class Delta:
    """One streamed chunk. time: time.perf_counter() when it arrived."""

    time: float
    content: str = ""
    reasoning: str = ""  # `reasoning_content` / `reasoning` of servers that split thinking off
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None  # the final usage chunk (stream_options.include_usage)


def check_url(url: str) -> str:
    """The API base (ending in /v1) of a server given either way; a clear error for what is not an http(s) URL."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--url must start with http:// or https:// (got {url!r})")
    return api_base(url)


class OpenAIChatClient:
    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.base = check_url(url)
        self.api_key = api_key
        self._client: OpenAIClient | None = None  # made on first use, on the event loop that uses it
        # vLLM's stream option (SGLang and minisgl serve take it too): every chunk's usage counts the tokens so far, so
        # the chat knows how many tokens a chunk carries; off for good once a server refuses it
        self.continuous_usage = True

    @property
    def client(self) -> OpenAIClient:
        if self._client is None:
            self._client = OpenAIClient(self.base, api_key=self.api_key)
        return self._client

    def models(self) -> list[dict[str, Any]]:
        """GET /v1/models (blocking: for start-up, before the chat's event loop runs)."""

        async def ask() -> list[dict[str, Any]]:
            async with OpenAIClient(self.base, api_key=self.api_key) as client:
                return await self._models(client)

        return asyncio.run(ask())

    async def list_models(self) -> list[dict[str, Any]]:
        """GET /v1/models on the loop this client runs on (`/model`)."""
        return await self._models(self.client)

    async def _models(self, client: OpenAIClient) -> list[dict[str, Any]]:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                data = await client.models()
        except HTTPStatusError as e:
            raise RemoteError(f"{self.base}/models answered {e.status}: {e.message}", e.status) from e
        except (OSError, TimeoutError, ValueError) as e:  # ValueError: not JSON
            raise RemoteError(f"cannot reach {self.base}: {e or type(e).__name__}") from e
        if not all(isinstance(m, dict) for m in data):
            raise RemoteError(f"{self.base}/models: no model list in the answer")
        return data

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[Delta]:
        """POST /v1/chat/completions with stream=true; yields each chunk's delta (with continuous usage where the server
        gives it). RemoteError on any failure, including an error event mid-stream or a stream that ends without a
        finish_reason. Leaving early (the task cancelled) drops the connection, which makes the server abort the
        request."""
        try:
            async with aclosing(self._stream(body, self.continuous_usage)) as deltas:
                async for delta in deltas:
                    yield delta
        except RemoteError as e:
            # a server that checks stream_options strictly: asked again without the option, which is only for TBT
            if not (self.continuous_usage and e.status == 400 and "continuous_usage_stats" in str(e)):
                raise
            self.continuous_usage = False
            async with aclosing(self._stream(body, False)) as deltas:
                async for delta in deltas:
                    yield delta

    async def _stream(self, body: dict[str, Any], continuous_usage: bool) -> AsyncGenerator[Delta]:
        options = {"include_usage": True, **({"continuous_usage_stats": True} if continuous_usage else {})}
        body = {**body, "stream": True, "stream_options": options}
        finished = False
        try:
            async with aclosing(self.client.stream("/v1/chat/completions", body)) as events:
                async for ev in events:
                    finished = finished or ev.finish_reason is not None
                    yield Delta(ev.time, ev.text, ev.reasoning, ev.finish_reason, ev.usage)
        except HTTPStatusError as e:
            # minisgl and OpenAI send code context_length_exceeded; vLLM says "maximum context length" in its message
            over = e.status == 400 and (e.code == "context_length_exceeded" or "context length" in e.message.lower())
            raise RemoteError(f"server answered {e.status}: {e.message}", e.status, over) from e
        except StreamError as e:
            raise RemoteError(str(e)) from e
        except (OSError, asyncio.IncompleteReadError) as e:
            raise RemoteError(f"lost the server: {type(e).__name__}: {e}") from e
        except ValueError as e:  # json
            raise RemoteError(f"bad stream from the server: {e}") from e
        if not finished:
            raise RemoteError("the server ended the stream before the answer finished")

    async def metrics_text(self) -> str | None:
        """GET /metrics; None when the server has none (or cannot be reached now)."""
        try:
            async with asyncio.timeout(METRICS_TIMEOUT):
                status, body = await self.client.get("/metrics")
        except (OSError, TimeoutError, asyncio.IncompleteReadError, StreamError):
            return None
        return body.decode(errors="replace") if status == 200 else None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
