"""Any OpenAI-compatible server as a chat backend (`minisgl chat --url`): answers stream through remote.py with
TTFT and TBT measured here, at the client; the panel's KV/scheduler numbers come from the server's /metrics. The
backend's HTTP runs on an event loop in a thread of its own (ServerAnswer says why)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from engine.sampling_params import SamplingParams
from minisgl_cli.tui.backend import BackendError, too_long
from minisgl_cli.tui.prom import load_from_metrics
from minisgl_cli.tui.remote import OpenAIChatClient, RemoteError
from minisgl_cli.tui.session import sampling_given
from minisgl_cli.tui.stats import Load
from minisgl_cli.tui.turn import Piece

T = TypeVar("T")

# How long the reading thread waits for the GIL while the UI's thread runs Python (sys.setswitchinterval): with
# Python's 5 ms, chunks 10 ms apart read during Markdown redraws showed TBT p50 / p90 7.5 / 25 ms; with 1 ms,
# 10.4 / 17 (a client in a process of its own, beside it: 10.4 / 13; the 2-core CPU machine).
GIL_SWITCH_S = 0.001


class ServerAnswer:
    """Read on the backend's own event loop, so each chunk is stamped as it reaches the socket however busy the chat's
    loop is: read on Textual's loop, the chunks that came while it redrew Markdown were stamped together when it got
    round to them (chunks 10 ms apart showed TBT p50 / p90 7.7 / 31.5 ms, or 0.0 / 33.3). The pieces go to the loop
    that started the answer. stop() cancels the read, which closes the connection (the server then aborts the
    request), even while no token is arriving."""

    opens_in_thinking = False

    def __init__(self, client: OpenAIChatClient, body: dict[str, Any], io: asyncio.AbstractEventLoop) -> None:
        self.started = time.perf_counter()
        self._q: asyncio.Queue[Piece] = asyncio.Queue()
        self._home, self._io = asyncio.get_running_loop(), io
        self._task: asyncio.Task[Piece] | None = None
        io.call_soon_threadsafe(self._begin, client, body)

    def _begin(self, client: OpenAIChatClient, body: dict[str, Any]) -> None:
        self._task = asyncio.create_task(self._read(client, body))
        # a done callback, not an except clause in _read: a task cancelled before it ever ran never enters _read
        self._task.add_done_callback(
            lambda task: self._give(Piece(finished=True, finish_reason="abort") if task.cancelled() else task.result())
        )

    def _give(self, piece: Piece) -> None:
        with contextlib.suppress(RuntimeError):  # the chat's loop has closed: nobody reads this answer any more
            self._home.call_soon_threadsafe(self._q.put_nowait, piece)

    async def _read(self, client: OpenAIChatClient, body: dict[str, Any]) -> Piece:
        """On the backend's loop: hands the text on as it comes; the last piece is returned."""
        reason: str | None = None
        usage: dict[str, Any] = {}
        counted, last = 0, None  # output tokens and the arrival of the text chunks so far
        try:
            async for d in client.stream(body):
                usage = d.usage or usage
                reason = reason or d.finish_reason
                if d.content or d.reasoning:
                    so_far = (d.usage or {}).get("completion_tokens")  # continuous usage; else one token a chunk
                    n = max(1, so_far - counted) if isinstance(so_far, int) else 1
                    counted += n
                    self._give(Piece(d.content, d.reasoning, token_times(last, d.time, n)))
                    last = d.time
        except RemoteError as e:
            why = too_long(str(e), body["messages"], *overflow_counts(str(e))) if e.too_long else str(e)
            return Piece(finished=True, finish_reason="error", error=why)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return Piece(
            finished=True,
            finish_reason=reason,
            prompt_tokens=usage.get("prompt_tokens"),
            cache_hit_tokens=cached,
            output_tokens=usage.get("completion_tokens"),
        )

    async def __aiter__(self) -> AsyncIterator[Piece]:
        while True:
            piece = await self._q.get()
            yield piece
            if piece.finished:
                return

    def stop(self) -> None:
        self._io.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self._task is not None:  # always set: _begin was queued first
            self._task.cancel()


class ServerBackend:
    thinking_switch: bool | None = None  # sent as chat_template_kwargs; servers whose template lacks it ignore it
    switches_models = True

    def __init__(self, client: OpenAIChatClient, model: str, served: list[dict[str, Any]] | None = None) -> None:
        """served: the server's /v1/models entries (`model` among them, with its `max_model_len` where the server
        gives one)."""
        self.client = client
        self._served = {str(m.get("id")): m for m in served or [] if isinstance(m, dict)}
        self._served.setdefault(model, {})
        self.use_model(model)
        self._io: asyncio.AbstractEventLoop | None = None  # where self.client runs, from ready() to aclose()
        self._io_thread: threading.Thread | None = None
        self._switch = sys.getswitchinterval()  # set back by aclose()

    @classmethod
    def connect(cls, url: str, api_key: str | None, model: str | None, resumed: str | None = None) -> ServerBackend:
        """Ask the server for its models (blocking): `model` if given, else `resumed` (the model a resumed chat was
        saved with) where the server serves it, else the first. RemoteError if the server cannot be reached or does
        not serve `model`."""
        client = OpenAIChatClient(url, api_key)
        served = client.models()
        ids = [str(m.get("id")) for m in served if isinstance(m, dict)]
        if model is None:
            if not ids:
                raise RemoteError(f"{client.base}/models lists no model; name one with --served-model")
            # a resumed chat goes on with its own model (it took the first, and /model had to switch back to it)
            model = resumed if resumed in ids else ids[0]
        elif ids and model not in ids:
            raise RemoteError(f"{client.base} does not serve {model!r} (it serves: {', '.join(ids)})")
        return cls(client, model, served)

    async def models(self) -> list[str]:
        try:
            served = await self._on_io(self.client.list_models())
        except RemoteError as e:
            raise BackendError(str(e)) from e
        # a server that lists none (it answered --served-model all the same) still serves the model answering
        self._served = {str(m.get("id")): m for m in served} or {self.model: self._served.get(self.model, {})}
        return list(self._served)

    def use_model(self, model: str) -> None:
        if model not in self._served:
            raise ValueError(f"{self.client.base} does not serve {model!r} (it serves: {', '.join(self._served)})")
        self.model, self.title = model, f"{model} · {self.client.base}"
        limit = self._served[model].get("max_model_len")
        self.context_limit: int | None = limit if isinstance(limit, int) else None

    def start(self, messages: list[dict[str, str]], params: SamplingParams, thinking: bool | None) -> ServerAnswer:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
        }
        # the other fields only when set: a server that takes no top_k (OpenAI's own) still serves a chat that sets none
        body.update(sampling_given(params))
        if thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": thinking}
        assert self._io is not None, "ready() first"
        return ServerAnswer(self.client, body, self._io)

    async def ready(self) -> None:
        """connect() found the server; start the loop its requests run on."""
        sys.setswitchinterval(min(self._switch, GIL_SWITCH_S))
        self._io = asyncio.new_event_loop()
        self._io_thread = threading.Thread(target=self._io.run_forever, name="minisgl-chat-http", daemon=True)
        self._io_thread.start()

    async def _on_io(self, coro: Coroutine[Any, Any, T]) -> T:
        """`coro` run on the backend's loop, awaited from the chat's."""
        assert self._io is not None, "ready() first"
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._io))

    async def load(self) -> Load | None:
        text = await self._on_io(self.client.metrics_text())
        return None if text is None else load_from_metrics(text)

    async def aclose(self) -> None:
        if self._io is None or self._io_thread is None:
            return
        await self._on_io(self._close_io())
        self._io.call_soon_threadsafe(self._io.stop)
        self._io_thread.join(timeout=10)
        self._io.close()
        self._io = self._io_thread = None
        sys.setswitchinterval(self._switch)

    async def _close_io(self) -> None:
        """On the backend's loop: end the answers still streaming (their connections close), then the idle ones."""
        rest = asyncio.all_tasks() - {asyncio.current_task()}
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        await self.client.aclose()


def token_times(last: float | None, now: float, n: int) -> list[float]:
    """Times for the `n` tokens of a chunk that came at `now`, the one before it at `last`: the gap spread evenly, so
    TBT is per token, as SGLang's bench_serving counts a chunk of n tokens (n intervals of gap / n). Shown per chunk,
    an emoji or CJK text, which the server sends 2-3 tokens at a time, showed TBT as the gap between characters.
    The first chunk's tokens all came at TTFT: the turn counts no interval for them."""
    if last is None:
        return [now] * n
    return [last + (now - last) * k / n for k in range(1, n)] + [now]


def overflow_counts(message: str) -> tuple[int | None, int | None]:
    """The prompt's tokens and the limit a server's context-length refusal names, so the chat's hint can say whether a
    shorter answer would fit (a prompt alone over the limit cannot): minisgl's "prompt (N tokens) + ... exceeds the
    model's context length M [and the KV cache capacity of K tokens]", vLLM's "maximum context length is M tokens ...
    (N in the messages" or "... your request has N input tokens". (None, None) for any other wording."""
    import re

    prompt = re.search(r"prompt \((\d+) tokens\)|\((\d+) in the messages|request has (\d+) input tokens", message)
    limits = [int(a or b) for a, b in re.findall(r"context length (?:is )?(\d+)|KV cache capacity of (\d+)", message)]
    if prompt is None or not limits:
        return None, None
    return int(next(g for g in prompt.groups() if g)), min(limits)
