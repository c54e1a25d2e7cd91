"""The engine's side of the server: its step loop, fed by a front end in another process (or thread).
Commands arrive on one ZeroMQ pipe and are applied between steps; each step sends one message with every
changed request's new token ids. No text is handled here: the front end tokenizes and detokenizes."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import zmq

from engine.engine import Engine
from engine.ipc import Addresses, EngineInfo, connect, pack, params_from_wire, unpack
from engine.llm import LLM
from engine.request import Req
from engine.step_loop import StepLoop


def engine_info(llm: LLM) -> EngineInfo:
    d = llm.describe()
    return EngineInfo(
        d["model"],
        d["device"],
        d["dtype"],
        d["attention"],
        int(d["tp"]),
        llm.config.max_running_requests,
        llm.engine.limits,
        d["kv_cache_dtype"],
    )


Watch = Callable[[], str | None]  # returns why the loop must stop (e.g. the front end exited), else None


class EngineLoop(StepLoop):
    WATCH_EVERY = 0.5  # seconds between calls of the watch function

    def __init__(self, engine: Engine, addrs: Addresses, info: EngineInfo):
        super().__init__()
        self.engine, self.info = engine, info
        self.ctx = zmq.Context()
        self.commands = connect(self.ctx.socket(zmq.PULL), addrs.commands, bind=True)
        self.outputs = connect(self.ctx.socket(zmq.PUSH), addrs.outputs, bind=True)
        self.sent: dict[str, int] = {}  # rid -> output ids already sent, for requests still running
        self.clearing: list[int] = []  # clear_cache calls to answer after the next step
        self.stopped_by: str | None = None  # why the watch stopped it
        self._stop = False
        self._watch: Watch | None = None
        self._next_watch = 0.0
        # An idle loop waits up to IDLE_TICK for a command: a byte here ends the wait at once (wake)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.poller = zmq.Poller()
        self.poller.register(self.commands, zmq.POLLIN)
        self.poller.register(self._wake_r, zmq.POLLIN)

    def stop(self) -> None:
        """Ask the loop to end after its current step (signal handlers, other threads)."""
        self._stop = True
        self.wake()

    def wake(self) -> None:
        """Have the loop call its watch now instead of after up to WATCH_EVERY + IDLE_TICK (any thread, signal
        handlers: a socket's send is safe in both). A Ctrl-C'd `serve` and a chat's exit waited that long."""
        self._next_watch = 0.0
        try:
            self._wake_w.send(b"\0")
        except OSError:  # BlockingIOError: bytes already wait to wake it; or closed: it has ended
            pass

    def run(self, watch: Watch | None = None) -> None:
        self._watch, self._next_watch = watch, time.monotonic() + self.WATCH_EVERY
        self._run_steps()
        # Whatever ended the loop, the front end fails its open requests with this and answers 503 from now on.
        self._send(["dead", self.error or self.stopped_by or "engine shut down", self.error is None])

    def _busy(self) -> bool:
        return self.engine.has_work()

    def _stopping(self) -> bool:
        if self._watch is not None and not self._stop and time.monotonic() >= self._next_watch:
            self._next_watch = time.monotonic() + self.WATCH_EVERY
            self.stopped_by = self._watch()
            self._stop = bool(self.stopped_by)
        return self._stop

    def _step(self) -> None:
        changed = self.engine.step()
        if changed:
            self._send_step(changed)
        for seq in self.clearing:  # the step applied every command queued before it
            self._send(["reply", seq, True])
        self.clearing.clear()

    def close(self) -> None:
        self.commands.close()
        self.outputs.close()
        self.ctx.term()
        self._wake_r.close()
        self._wake_w.close()

    def _send(self, msg: list[Any]) -> None:
        try:
            self.outputs.send(pack(msg), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            pass  # no front end connected (it is gone): nobody to tell, and the engine must never block

    def _send_step(self, changed: list[Req]) -> None:
        entries = []
        for req in changed:
            n = self.sent.get(req.rid)
            if n is None:
                continue  # already reported finished
            if req.finished:
                del self.sent[req.rid]
            else:
                self.sent[req.rid] = len(req.output_ids)
            entry: list[Any] = [
                req.rid,
                req.output_ids[n:],
                req.token_times[n:],
                req.finish_reason,
                req.error,
                req.cache_hit_tokens,
            ]
            if req.params.logprobs is not None or req.params.prompt_logprobs is not None:
                first = n == 0 and req.params.prompt_logprobs is not None
                prompt = [lp.to_wire() for lp in req.prompt_logprobs] if first else None  # once, with the first
                entry += [[lp.to_wire() for lp in req.logprobs[n:]], prompt]
            entries.append(entry)
        if entries:
            self._send(["step", entries])

    def _receive(self, block: bool) -> None:
        if block:
            ready = dict(self.poller.poll(int(self.IDLE_TICK * 1000)))
            if self._wake_r in ready:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except BlockingIOError:
                    pass
            if self.commands not in ready:
                return
        while True:
            try:
                msg = unpack(self.commands.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            self._apply(msg)

    def _apply(self, msg: list[Any]) -> None:
        kind = msg[0]
        if kind == "add":
            _, rid, ids, params = msg
            try:
                self.engine.add_request(ids, params_from_wire(params), rid)
            except (ValueError, TypeError) as e:
                self._send(["refused", rid, str(e)])
                return
            self.sent[rid] = 0
        elif kind == "abort":
            _, rid, reason = msg
            if rid in self.sent:
                self.engine.abort(rid, reason)
        elif kind == "metrics":
            self._send(["reply", msg[1], asdict(self.engine.metrics())])
        elif kind == "clear_cache":  # done at the next step, which the command itself makes the engine run
            self.engine.clear_cache()
            self.clearing.append(msg[1])
        elif kind == "hello":
            self._send(["hello", self.info.to_wire()])
