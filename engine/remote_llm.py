"""The front end's handle on an engine running in another process (engine_loop.EngineLoop): AsyncLLM's calls
(submit, abort, alive, error) and the engine's metrics and clear_cache, over ZeroMQ. Tokenization and
detokenization happen here, in the front end, so the engine's loop spends nothing on text. Use it from one asyncio
event loop."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from engine.ipc import Addresses, EngineInfo, connect, pack, params_to_wire, unpack
from engine.logprobs import TokenLogprob
from engine.metrics import EngineMetrics
from engine.sampling_params import SamplingParams
from engine.streams import END, EngineDeadError, RequestStream
from engine.text import Prompt, RequestOutput, TextState, encode_prompt
from engine.tokenizer import Tokenizer


@dataclass(eq=False, slots=True)
class _Pending:
    """A submitted request as the front end tracks it."""

    stream: RequestStream
    text: TextState
    token_ids: list[int] = field(default_factory=list)
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


class RemoteLLM:
    def __init__(self, tokenizer: Tokenizer, addrs: Addresses):
        self.tokenizer = tokenizer
        self._sync_ctx = zmq.Context()
        self._async_ctx = zmq.asyncio.Context()
        # Sends never block (no high-water mark), so a plain socket serves the event loop's synchronous calls.
        self._commands = connect(self._sync_ctx.socket(zmq.PUSH), addrs.commands, bind=False)
        self._outputs = connect(self._async_ctx.socket(zmq.PULL), addrs.outputs, bind=False)
        self.pending: dict[str, _Pending] = {}
        self._replies: dict[int, asyncio.Future[Any]] = {}  # the engine's answers to metrics and clear_cache
        self._seq = itertools.count()
        self.error: str | None = None
        self.info: EngineInfo | None = None
        self._receiver: asyncio.Task[None] | None = None

    async def start(self, timeout: float = 60.0) -> EngineInfo:
        """Greet the engine and start receiving its steps; returns what it serves. The greeting is repeated until
        answered: either pipe may still be connecting, and a message sent before it is up is dropped."""
        deadline = time.monotonic() + timeout
        while self.info is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine did not answer within {timeout:.0f} s")
            with contextlib.suppress(zmq.Again):
                self._commands.send(pack(["hello"]), zmq.NOBLOCK)
            if await self._outputs.poll(200):
                msg = unpack(await self._outputs.recv())
                if msg[0] == "hello":
                    self.info = EngineInfo.from_wire(msg[1])
        self._receiver = asyncio.create_task(self._receive())
        return self.info

    @property
    def alive(self) -> bool:
        return self.error is None and self._receiver is not None and not self._receiver.done()

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def submit(
        self, prompt: Prompt, params: SamplingParams, rid: str, sink: Callable[[object], None] | None = None
    ) -> RequestStream:
        """Validates now (ValueError for bad input, EngineDeadError once the engine is gone), then sends it. Its
        outputs, then END or an exception, go to the returned stream, or to `sink` as they arrive (RequestStream).
        A consumer that stops iterating the stream before its end (break, an exception, its task cancelled) aborts
        the request, as AsyncLLM's do, instead of leaving it to run on to max_tokens holding its KV pages."""
        if not self.alive:
            raise EngineDeadError(f"engine is not running: {self.error or 'stopped'}")
        assert self.info is not None
        ids = self.encode(prompt)
        params = self.info.limits.check(ids, params)  # the request's own copy, as the engine runs it
        stream = RequestStream(rid, ids, asyncio.get_running_loop(), sink=sink, on_abandon=lambda: self.abort(rid))
        p = _Pending(stream, TextState.create(self.tokenizer, ids, params))
        if params.logprobs is not None:
            p.logprobs = []
        self.pending[rid] = p
        self._send(["add", rid, ids, params_to_wire(params)])
        return stream

    def abort(self, rid: str, reason: str = "abort") -> None:
        if rid in self.pending and self.alive:
            self._send(["abort", rid, reason])

    async def metrics(self, timeout: float = 10.0) -> EngineMetrics | None:
        """A snapshot taken by the engine between steps; None if the engine is gone or does not answer."""
        got = await self._call("metrics", timeout)
        return None if got is None else EngineMetrics(**got)

    async def clear_cache(self, timeout: float = 60.0) -> bool:
        """Drop the prefix cache's pages no request holds (vLLM's reset_prefix_cache, SGLang's flush_cache); True
        once the engine has done it (at its next step), False if it is gone or does not answer."""
        return await self._call("clear_cache", timeout) is not None

    async def _call(self, kind: str, timeout: float) -> Any:
        """Send `kind` with a sequence number; the engine's answer to it, or None (gone, or no answer in time)."""
        if not self.alive:
            return None
        seq = next(self._seq)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[seq] = fut
        self._send([kind, seq])
        try:
            return await asyncio.wait_for(fut, timeout)
        except (TimeoutError, EngineDeadError):
            return None
        finally:
            self._replies.pop(seq, None)

    def fail_all(self, why: str, stopped: bool = False) -> None:
        """The engine is gone (`stopped`: shut down, not crashed): every open stream and metrics call ends with
        EngineDeadError(why, stopped)."""
        self.error = self.error or why
        for p in self.pending.values():
            p.stream.put(EngineDeadError(why, stopped))
        self.pending.clear()
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(why, stopped))
        if self._receiver is not None and self._receiver is not asyncio.current_task():
            self._receiver.cancel()

    def close(self) -> None:
        if self._receiver is not None:
            self._receiver.cancel()
        self._commands.close()
        self._outputs.close()
        self._sync_ctx.term()
        self._async_ctx.term()

    def _send(self, msg: list[Any]) -> None:
        try:
            self._commands.send(pack(msg), zmq.NOBLOCK, copy=False)
        except zmq.Again:  # the engine's end is gone
            self.fail_all("the engine process is gone")

    # ---- receiving -------------------------------------------------------------------------------------
    async def _receive(self) -> None:
        while True:
            msg = unpack(await self._outputs.recv())
            kind = msg[0]
            if kind == "step":
                for entry in msg[1]:
                    self._on_tokens(*entry)
            elif kind == "reply":  # ["reply", seq, answer]: to metrics or clear_cache
                fut = self._replies.get(msg[1])
                if fut is not None and not fut.done():
                    fut.set_result(msg[2])
            elif kind == "refused":
                p = self.pending.pop(msg[1], None)
                if p is not None:
                    p.stream.put(ValueError(msg[2]))
            elif kind == "dead":
                self.fail_all(msg[1], msg[2])
                return

    def _on_tokens(
        self,
        rid: str,
        new_ids: list[int],
        token_times: list[float],
        reason: str | None,
        error: str | None,
        cache_hit_tokens: int,
        logprobs: list[list[Any]] | None = None,
        prompt_logprobs: list[list[Any]] | None = None,
    ) -> None:
        p = self.pending.get(rid)
        if p is None:
            return  # ended here already (a stop string, a text fault): the engine's last word is moot
        if logprobs and p.logprobs is not None:
            p.logprobs += map(TokenLogprob.from_wire, logprobs)
        if prompt_logprobs is not None:
            p.prompt_logprobs = [TokenLogprob.from_wire(w) for w in prompt_logprobs]
        if new_ids:
            p.token_ids += new_ids
            p.token_times += token_times  # the engine's (engine/ipc.py)
            if p.first_token_time is None:
                p.first_token_time = token_times[0]
        engine_reason = reason
        delta, reason, error = p.text.advance(new_ids, reason, error)
        finished = reason is not None
        if finished:
            del self.pending[rid]
            if engine_reason is None:  # a stop string or a text fault ended it here: free its pages there
                self._send(["abort", rid, reason])
        text = p.text.text[: p.text.emitted]
        # token_ids / token_times are the request's growing lists, not copies (the front end's hot path): the
        # server reads each output as it comes and keeps none but the last.
        p.stream.put(
            RequestOutput(
                rid,
                p.stream.prompt_ids,
                p.token_ids,
                text,
                delta,
                new_ids,
                finished,
                reason,
                error,
                cache_hit_tokens,
                p.arrival,
                p.first_token_time,
                p.token_times,
                p.logprobs,
                p.prompt_logprobs,
                p.text.stop_reason,
                None,
                self.tokenizer.token_texts if p.text.detok is not None else None,
            )
        )
        if finished:
            p.stream.put(END)
