"""Per-request output streams, shared by the in-process AsyncLLM and the server's RemoteLLM."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from engine.text import RequestOutput

END = object()


class EngineDeadError(RuntimeError):
    """The engine is gone. `stopped`: it was shut down (a signal, its front end or launcher leaving), not crashed; an
    answer it cut was stopped, not failed."""

    def __init__(self, why: str = "", stopped: bool = False):
        super().__init__(why)
        self.stopped = stopped


class RequestStream:
    """Outputs of one request, consumable from plain threads (iterate) or asyncio (async iterate)."""

    def __init__(
        self,
        rid: str,
        prompt_ids: list[int],
        loop: asyncio.AbstractEventLoop | None,
        final_only: bool = False,
        sink: Callable[[object], None] | None = None,
        on_abandon: Callable[[], object] | None = None,
    ):
        self.rid, self.prompt_ids = rid, prompt_ids
        self.final_only = final_only  # only the finished output (with every token's time) arrives
        self._loop = loop
        self._q: queue.Queue[Any] | asyncio.Queue[Any] = asyncio.Queue() if loop else queue.Queue()  # outputs, then END
        # With a sink, each item goes to it (on the loop's thread) instead of the queue, and nothing iterates: a
        # consumer without a task of its own saves a pass through the event loop per output (serve's hot path).
        self._sink = sink
        # Called when a consumer leaves the iteration before the end (break, an exception, its task cancelled): the
        # owner aborts the request, which would otherwise run on to max_tokens holding its KV pages.
        self._on_abandon = on_abandon

    def put(self, item: object) -> None:
        """An output, an exception, or END; from any thread."""
        deliver = self._q.put_nowait if self._sink is None else self._sink
        if self._loop is None or asyncio._get_running_loop() is self._loop:
            deliver(item)
            return
        try:
            self._loop.call_soon_threadsafe(deliver, item)
        except RuntimeError:
            if not self._loop.is_closed():
                raise
            # The consumer's loop has ended (an engine shutting down after its caller): nobody is left to read it.

    def __iter__(self) -> Iterator[RequestOutput]:
        if not isinstance(self._q, queue.Queue):  # not an assert: the request would run on unread (and -O drops it)
            self._abandoned()
            raise TypeError("this stream was created for asyncio (submit(..., loop=...)): use `async for`")
        ended = False
        try:
            while (item := self._q.get()) is not END:
                if isinstance(item, Exception):
                    ended = True
                    raise item
                yield item
            ended = True
        finally:
            if not ended:
                self._abandoned()

    async def __aiter__(self) -> AsyncGenerator[RequestOutput, None]:
        if not isinstance(self._q, asyncio.Queue):
            self._abandoned()
            raise TypeError("this stream was created for threads (submit() without loop=): use `for`")
        assert self._sink is None, "its outputs go to the sink"
        ended = False
        try:
            while (item := await self._q.get()) is not END:
                if isinstance(item, Exception):
                    ended = True
                    raise item
                yield item
            ended = True
        finally:
            if not ended:
                self._abandoned()

    def _abandoned(self) -> None:
        if self._on_abandon is not None:
            self._on_abandon()
