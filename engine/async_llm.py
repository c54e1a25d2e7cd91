"""Runs the engine loop in a background thread so servers and UIs can stream many requests at once."""

from __future__ import annotations

import asyncio
import queue
import threading
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar, cast

from engine.llm import LLM, Prompt, RequestOutput
from engine.sampling_params import SamplingParams

_END = object()
T = TypeVar("T")


class EngineDeadError(RuntimeError):
    pass


class RequestStream:
    """Outputs of one request, consumable from plain threads (iterate) or asyncio (async iterate)."""

    def __init__(self, rid: str, prompt_ids: list[int], loop: asyncio.AbstractEventLoop | None):
        self.rid, self.prompt_ids = rid, prompt_ids
        self._loop = loop
        # Carries RequestOutputs, then an exception or _END.
        self._q: queue.Queue[Any] | asyncio.Queue[Any] = asyncio.Queue() if loop else queue.Queue()

    def _put(self, item: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._q.put_nowait, item)
        else:
            self._q.put_nowait(item)

    def __iter__(self) -> Iterator[RequestOutput]:
        assert isinstance(self._q, queue.Queue), "created for asyncio: use `async for`"
        while (item := self._q.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            yield item

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        assert isinstance(self._q, asyncio.Queue), "created for threads: use `for`"
        while (item := await self._q.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            yield item


class AsyncLLM:
    """Thread-safe front of an LLM: submit() from any thread, outputs arrive on each RequestStream."""

    IDLE_TICK = 0.5  # seconds; under TP the loop steps even when idle so follower ranks stay in lockstep

    def __init__(self, llm: LLM):
        self.llm = llm
        self._inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()
        self.error: str | None = None
        self._stop = threading.Event()
        self._closed = False  # set under _lock when the loop ends: nothing is queued after that
        self._thread = threading.Thread(target=self._run, name="minisgl-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        rid: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> RequestStream:
        """Validates now (raising ValueError for bad input), then queues the request for the engine thread."""
        if not self.alive:
            raise EngineDeadError(f"engine is not running: {self.error or 'stopped'}")
        params = params or SamplingParams()
        ids = self.llm.encode(prompt)
        self.llm.engine.validate(ids, params)
        with self._lock:
            self._check_open()
            rid = rid or self.llm.engine.new_rid()
            stream = RequestStream(rid, ids, loop)
            self._inbox.put(("add", rid, ids, params, stream))
        return stream

    def _check_open(self) -> None:
        if self._closed:
            raise EngineDeadError(f"engine is not running: {self.error or 'stopped'}")

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))

    def call(self, fn: Callable[[LLM], T], timeout: float = 30.0) -> T:
        """Run fn(llm) on the engine thread (between steps) and return its result."""
        box: queue.Queue[tuple[bool, Any]] = queue.Queue()
        with self._lock:
            self._check_open()
            self._inbox.put(("call", fn, box))
        ok, value = box.get(timeout=timeout)
        if not ok:
            raise value
        return cast(T, value)

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout=30)

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self.IDLE_TICK) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind = item[0]
            if kind == "add":
                _, rid, ids, params, stream = item
                try:
                    self.llm.add_request(ids, params, rid)
                    self._streams[rid] = stream
                except Exception as e:
                    stream._put(ValueError(str(e)))
            elif kind == "abort" and item[1] in self._streams:
                self.llm.abort(item[1])
            elif kind == "call":
                try:
                    item[2].put((True, item[1](self.llm)))
                except Exception as e:
                    item[2].put((False, e))
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                idle = not self.llm.has_work()
                self._drain_inbox(block=idle)
                if not self.llm.has_work() and self.llm.config.tp == 1:
                    continue
                for out in self.llm.step():
                    stream = self._streams.get(out.rid)
                    if stream is None:
                        continue
                    stream._put(out)
                    if out.finished:
                        stream._put(_END)
                        del self._streams[out.rid]
        except Exception as e:  # the loop itself broke: fail everyone clearly instead of hanging them
            self.error = f"engine loop crashed: {type(e).__name__}: {e}"
            traceback.print_exc()
        finally:  # crashed or shut down: every open stream and everything still queued fails now
            with self._lock:
                self._closed = True
            why = self.error or "engine shut down"
            for stream in self._streams.values():
                stream._put(EngineDeadError(why))
            self._streams.clear()
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item[0] == "add":
                    item[4]._put(EngineDeadError(why))
                elif item[0] == "call":
                    item[2].put((False, EngineDeadError(why)))
