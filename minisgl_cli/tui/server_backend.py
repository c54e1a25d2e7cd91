"""Any OpenAI-compatible server as a chat backend (`minisgl chat --url`): answers stream through remote.py with
TTFT and TBT measured here, at the client; the panel's KV/scheduler numbers come from the server's /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from engine.sampling_params import SamplingParams
from minisgl_cli.tui.backend import too_long
from minisgl_cli.tui.prom import load_from_metrics
from minisgl_cli.tui.remote import OpenAIChatClient, RemoteError
from minisgl_cli.tui.stats import Load
from minisgl_cli.tui.turn import Piece

_END = object()


class ServerAnswer:
    """Reads the stream in a task of its own, so stop() can end it at once (closing the connection, which makes the
    server abort the request) even while no token is arriving."""

    opens_in_thinking = False

    def __init__(self, client: OpenAIChatClient, body: dict[str, Any]) -> None:
        self.started = time.perf_counter()
        self._q: asyncio.Queue[Piece] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._read(client, body))

    async def _read(self, client: OpenAIChatClient, body: dict[str, Any]) -> None:
        reason: str | None = None
        usage: dict[str, Any] = {}
        try:
            async for d in client.stream(body):
                usage = d.usage or usage
                reason = reason or d.finish_reason
                if d.content or d.reasoning:
                    self._q.put_nowait(Piece(d.content, d.reasoning, [d.time]))
        except asyncio.CancelledError:
            self._q.put_nowait(Piece(finished=True, finish_reason="abort"))
            return
        except RemoteError as e:
            why = too_long(str(e), body["messages"]) if e.too_long else str(e)
            self._q.put_nowait(Piece(finished=True, finish_reason="error", error=why))
            return
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        self._q.put_nowait(
            Piece(
                finished=True,
                finish_reason=reason,
                prompt_tokens=usage.get("prompt_tokens"),
                cache_hit_tokens=cached,
                output_tokens=usage.get("completion_tokens"),
            )
        )

    async def __aiter__(self) -> AsyncIterator[Piece]:
        while True:
            piece = await self._q.get()
            yield piece
            if piece.finished:
                return

    def stop(self) -> None:
        self._task.cancel()


class ServerBackend:
    thinking_switch: bool | None = None  # sent as chat_template_kwargs; servers whose template lacks it ignore it

    def __init__(self, client: OpenAIChatClient, model: str, context_limit: int | None = None) -> None:
        self.client, self.model = client, model
        self.title = f"{model} · {client.base}"
        self.context_limit = context_limit

    @classmethod
    def connect(cls, url: str, api_key: str | None, model: str | None) -> ServerBackend:
        """Ask the server for its models (blocking); the first one unless `model` names one. RemoteError if the
        server cannot be reached or does not serve it."""
        client = OpenAIChatClient(url, api_key)
        served = client.models()
        ids = [str(m.get("id")) for m in served if isinstance(m, dict)]
        if model is None:
            if not ids:
                raise RemoteError(f"{client.base}/models lists no model; name one with --served-model")
            model = ids[0]
        elif ids and model not in ids:
            raise RemoteError(f"{client.base} does not serve {model!r} (it serves: {', '.join(ids)})")
        info = next((m for m in served if isinstance(m, dict) and m.get("id") == model), {})
        limit = info.get("max_model_len")
        return cls(client, model, limit if isinstance(limit, int) else None)

    def start(self, messages: list[dict[str, str]], params: SamplingParams, thinking: bool | None) -> ServerAnswer:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
        }
        if thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": thinking}
        return ServerAnswer(self.client, body)

    async def ready(self) -> None:
        pass  # connect() found the server

    async def load(self) -> Load | None:
        text = await self.client.metrics_text()
        return None if text is None else load_from_metrics(text)

    async def aclose(self) -> None:
        await self.client.aclose()
