"""Runs the engine loop in a background thread so servers and UIs can stream many requests at once."""

from __future__ import annotations

import asyncio
import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any, TypeVar, cast

from engine.llm import LLM, Prompt
from engine.sampling_params import SamplingParams
from engine.step_loop import StepLoop
from engine.streams import END, EngineDeadError, RequestStream

__all__ = ["AsyncLLM", "EngineDeadError", "RequestStream"]
T = TypeVar("T")


class AsyncLLM(StepLoop):
    """Thread-safe front of an LLM: submit() from any thread, outputs arrive on each RequestStream."""

    def __init__(self, llm: LLM):
        super().__init__()
        self.llm = llm
        self._inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False  # set under _lock when the loop ends: nothing is queued after that
        # rids of submitted requests whose stream has not ended: a generated rid must avoid those still queued in
        # the inbox too (a caller's own "req-N" not yet in the engine got the same generated id, which was refused)
        self._open: set[str] = set()
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
        final_only: bool = False,
    ) -> RequestStream:
        """Validates now (raising ValueError for bad input), then queues the request for the engine thread.
        final_only: the stream gets the finished output alone, not one per step: a consumer that wants only the
        result (its token times are the engine's) then costs the engine thread no wake-up of its loop per token.
        A consumer that stops iterating the stream before its end (break, an exception, its task cancelled) aborts
        the request: its KV pages go back at the next step."""
        if not self.alive:
            raise EngineDeadError(f"engine is not running: {self.error or 'stopped'}")
        ids = self.llm.encode(prompt)
        # the request's own copy: later edits of the caller's miss it
        params = self.llm.engine.validate(ids, self.llm.params_for(ids, params))
        with self._lock:
            self._check_open()
            if rid is None:
                rid = self.llm.engine.new_rid()
                while rid in self._open:
                    rid = self.llm.engine.new_rid()
            self._open.add(rid)
            stream = RequestStream(rid, ids, loop, final_only, on_abandon=lambda: self.abort(rid))
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

    def _busy(self) -> bool:
        return self.llm.has_work()

    def _stopping(self) -> bool:
        return self._stop.is_set()

    def _step(self) -> None:
        for out in self.llm.step():
            stream = self._streams.get(out.rid)
            if stream is None or (stream.final_only and not out.finished):
                continue
            stream.put(out)
            if out.finished:
                stream.put(END)
                del self._streams[out.rid]
                self._open.discard(out.rid)

    def _receive(self, block: bool) -> None:
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
                    stream.put(ValueError(str(e)))
                    if rid not in self._streams:
                        self._open.discard(rid)
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
            self._run_steps()
        finally:  # crashed or shut down: every open stream and everything still queued fails now
            with self._lock:
                self._closed = True
            why, stopped = self.error or "engine shut down", self.error is None
            open_rids = list(self._streams) if stopped else []
            for stream in self._streams.values():
                stream.put(EngineDeadError(why, stopped))
            self._streams.clear()
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item[0] == "add":
                    item[4].put(EngineDeadError(why, stopped))
                elif item[0] == "call":
                    item[2].put((False, EngineDeadError(why, stopped)))
            # Shut down, not crashed: the open streams' requests end in the LLM too. They held their pages, and the
            # LLM's next step (a generate() after this shutdown) ran them on.
            if open_rids:
                try:
                    for rid in open_rids:
                        self.llm.abort(rid)
                    self.llm.step()
                except Exception as e:  # the thread ends either way: say why instead of dying with a traceback
                    self.error = f"engine failed ending its requests at shutdown: {type(e).__name__}: {e}"
                    traceback.print_exc()
