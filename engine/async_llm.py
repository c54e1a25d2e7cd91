"""Runs the engine loop in a background thread so servers and UIs can stream many requests at once; vLLM's AsyncLLM
API on it (AsyncEngineArgs, from_engine_args, generate, abort, shutdown), so code written for vLLM's runs here."""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import traceback
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, TypeVar, cast

from engine.config import EngineConfig
from engine.llm import LLM, Prompt, RequestOutput, choice_requests, engine_config
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.step_loop import StepLoop
from engine.streams import END, EngineDeadError, RequestStream

__all__ = ["AsyncEngineArgs", "AsyncLLM", "AsyncLLMEngine", "EngineDeadError", "RequestStream"]
T = TypeVar("T")

# vLLM's AsyncEngineArgs keywords of its own that change no output here, at any value: there is no request log
ASYNC_MOOT = ("enable_log_requests", "disable_log_requests")


class AsyncEngineArgs:
    """vLLM's AsyncEngineArgs (vllm.engine.arg_utils): LLM()'s keywords, vLLM's names or ours, kept as attributes
    until AsyncLLM.from_engine_args builds the engine. Checked at once, as vLLM's dataclass is: a keyword neither
    vLLM's nor ours is a TypeError, a bad value a ValueError."""

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        self.model = model
        vars(self).update(kwargs)
        self.create_engine_config()

    def create_engine_config(self) -> EngineConfig:
        return self._resolve()[0]

    def _resolve(self) -> tuple[EngineConfig, str]:
        """The EngineConfig and generation_config setting, by LLM()'s own mapping of vLLM's keywords."""
        kw = {k: v for k, v in vars(self).items() if k not in ASYNC_MOOT}
        return engine_config(None, kw, "AsyncEngineArgs")


@dataclasses.dataclass(eq=False)
class _Family:
    """vLLM's ParentRequest: a generate() of n > 1 choices, run as n requests "j_<request_id>" (vLLM's child ids).
    Its id stays taken while any of them is open."""

    rid: str
    open: dict[str, RequestStream]  # the children whose last output has not arrived, by rid


def _tagged(arrived: asyncio.Queue[tuple[int, object]], j: int) -> Callable[[object], None]:
    """A sink putting choice j's items on the family's queue."""
    return lambda item: arrived.put_nowait((j, item))


class AsyncLLM(StepLoop):
    """Thread-safe front of an LLM: submit() from any thread, outputs arrive on each RequestStream. vLLM's AsyncLLM
    API too: from_engine_args(), `async for out in generate(prompt, params, request_id)`, abort(), shutdown()."""

    def __init__(self, llm: LLM, owns_llm: bool = False):
        """owns_llm: shutdown() shuts the LLM down too (from_engine_args built it); else the LLM is the caller's and
        goes on without this front."""
        super().__init__()
        self.llm = llm
        self._owns_llm = owns_llm
        self._inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False  # set under _lock when the loop ends: nothing is queued after that
        # rids of submitted requests whose stream has not ended, each with its stream: a generated rid must avoid
        # those still queued in the inbox too (a caller's own "req-N" not yet in the engine got the same generated id,
        # which was refused). abort() frees a rid at once (vLLM's); the stream it names then frees nothing later.
        self._open: dict[str, RequestStream | _Family] = {}
        self._family_of: dict[RequestStream, _Family] = {}  # each open child's parent
        self._ending: set[str] = set()  # finished rids the engine drops at its next step (a stop string ended them)
        self._thread = threading.Thread(target=self._run, name="minisgl-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_engine_args(
        cls,
        engine_args: AsyncEngineArgs,
        start_engine_loop: bool = True,
        usage_context: object = None,
        stat_loggers: None = None,
    ) -> AsyncLLM:
        """vLLM's: the engine the arguments ask for, its loop running. usage_context (vLLM's telemetry tag) is moot."""
        if not isinstance(engine_args, AsyncEngineArgs):
            raise TypeError(f"from_engine_args() takes an AsyncEngineArgs (got {type(engine_args).__name__})")
        if start_engine_loop is not True or stat_loggers is not None:
            raise TypeError(
                "from_engine_args() takes start_engine_loop=True and stat_loggers=None only: the loop starts with the "
                "engine here, and its metrics are read with AsyncLLM.call(lambda llm: llm.metrics())"
            )
        config, generation_config = engine_args._resolve()
        return cls(LLM(config, generation_config=generation_config), owns_llm=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def is_running(self) -> bool:  # vLLM's
        return self.alive

    @property
    def errored(self) -> bool:  # vLLM's: the engine loop crashed
        return self.error is not None

    @property
    def is_stopped(self) -> bool:  # vLLM's: no request can run any more (shut down, or crashed)
        return not self.alive

    @property
    def dead_error(self) -> EngineDeadError:  # vLLM's: what a request to a stopped engine raises
        return EngineDeadError(f"engine is not running: {self.error or 'stopped'}", self.error is None)

    async def check_health(self) -> None:
        """vLLM's: raises dead_error once the engine is not running (what a server's /health polls)."""
        if not self.alive:
            raise self.dead_error

    async def get_tokenizer(self) -> Any:
        """vLLM's: the model's Hugging Face tokenizer (LLM.get_tokenizer)."""
        return self.llm.get_tokenizer()

    async def generate(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None,
        request_id: str,
        *,
        lora_request: None = None,
        priority: int = 0,
    ) -> AsyncGenerator[RequestOutput, None]:
        """vLLM's AsyncLLM.generate: the request's outputs as the engine makes them, each one as
        sampling_params.output_kind says (CUMULATIVE: everything so far in `outputs[0]`; DELTA: only what is new;
        FINAL_ONLY: the finished output alone), the last one `finished`; with sampling_params.n > 1, `outputs` hold
        the n choices (vLLM's fan-out: requests "j_<request_id>", choice j seeded seed + j). Submitted at the first
        iteration; a bad prompt or request (too long, a bad field), a request_id still running (or a child's), or an
        engine shut down raise from there. abort(request_id) ends it with a last output (finish_reason "abort"); a
        consumer that leaves early (break, its task cancelled, the generator dropped) aborts it, its KV pages back at
        the engine's next step."""
        if lora_request is not None or priority != 0:
            raise TypeError("generate() takes lora_request=None and priority=0 only: no LoRA and no priorities here")
        kind = getattr(sampling_params, "output_kind", RequestOutputKind.CUMULATIVE)  # (the check names a non-params)
        if isinstance(sampling_params, SamplingParams) and sampling_params.n != 1:
            async for parent in self._generate_choices(prompt, sampling_params, request_id, kind):
                yield parent
            return
        final_only = kind == RequestOutputKind.FINAL_ONLY
        stream = self.submit(prompt, sampling_params, request_id, asyncio.get_running_loop(), final_only)
        outputs = stream.__aiter__()
        try:
            async for out in outputs:
                if out.finished or out.delta_token_ids:  # (vLLM's: none for a prefill chunk that made no token)
                    out.delta = kind == RequestOutputKind.DELTA
                    yield out
        finally:
            await outputs.aclose()  # its own `finally` aborts the request if it has not finished

    async def _generate_choices(
        self, prompt: Prompt, params: SamplingParams, request_id: str, kind: RequestOutputKind
    ) -> AsyncGenerator[RequestOutput, None]:
        """generate() of n > 1 choices, as vLLM fans it out: choice j is a request of its own (LLM.generate's choices,
        seed + j); each output is the parent's, `outputs` holding all n choices (DELTA: each one's new part, empty
        where it has none), `finished` once all are. FINAL_ONLY: one output, all finished."""
        choices = choice_requests(params)
        arrived: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
        streams = self._submit_choices(prompt, choices, request_id, asyncio.get_running_loop(), kind, arrived)
        latest = [
            RequestOutput(s.rid, s.prompt_ids, [], "", "", [], False, delta=kind == RequestOutputKind.DELTA)
            for s in streams
        ]
        done = [False] * len(streams)
        try:
            while not all(done):
                j, item = await arrived.get()
                if item is END:
                    continue
                if isinstance(item, Exception):
                    raise item
                out = cast(RequestOutput, item)
                if not (out.finished or out.delta_token_ids):  # (a prefill chunk that made no token)
                    continue
                done[j], out.delta = out.finished, kind == RequestOutputKind.DELTA
                if kind == RequestOutputKind.DELTA:  # the others' last parts were in earlier outputs
                    latest = [dataclasses.replace(o, delta_text="", delta_token_ids=[]) for o in latest]
                latest[j] = out
                if kind != RequestOutputKind.FINAL_ONLY or all(done):
                    yield dataclasses.replace(latest[0], rid=request_id, finished=all(done), other_choices=latest[1:])
        finally:
            for s, ended in zip(streams, done):
                if not ended:  # an error, the engine gone, or the consumer left: no child runs on
                    self._abort(s.rid, s)

    def _submit_choices(
        self,
        prompt: Prompt,
        choices: list[SamplingParams | None],
        rid: str,
        loop: asyncio.AbstractEventLoop,
        kind: RequestOutputKind,
        arrived: asyncio.Queue[tuple[int, object]],
    ) -> list[RequestStream]:
        """submit() of a family: every choice checked, then all ids (the parent's and each child's) taken at once or
        none. Each child's outputs arrive on `arrived` as (j, item)."""
        if not self.alive:
            raise self.dead_error
        ids = self.llm.encode(prompt)
        checked = [self.llm.engine.validate(ids, self.llm.params_for(ids, c)) for c in choices]
        rids = [f"{j}_{rid}" for j in range(len(choices))]
        with self._lock:
            self._check_open()
            for r in (rid, *rids):
                if r in self._open:
                    raise ValueError(f"Request id {r} already running.")
            family = _Family(rid, {})
            self._open[rid] = family
            final_only = kind == RequestOutputKind.FINAL_ONLY
            streams = []  # (not family.open read after the lock: the engine thread may have ended children by then)
            for j, (r, p) in enumerate(zip(rids, checked)):
                stream = RequestStream(r, ids, loop, final_only, sink=_tagged(arrived, j))
                family.open[r] = self._open[r] = stream
                self._family_of[stream] = family
                streams.append(stream)
                self._inbox.put(("add", r, ids, p, stream))
        return streams

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
            raise self.dead_error
        ids = self.llm.encode(prompt)
        # the request's own copy: later edits of the caller's miss it
        params = self.llm.engine.validate(ids, self.llm.params_for(ids, params))
        with self._lock:
            self._check_open()
            if rid is None:
                rid = self.llm.engine.new_rid()
                while rid in self._open:
                    rid = self.llm.engine.new_rid()
            elif rid in self._open:  # vLLM's refusal: abort(rid) and the outputs' request_id name one request
                raise ValueError(f"Request id {rid} already running.")
            stream = RequestStream(rid, ids, loop, final_only, on_abandon=lambda: self._abort(rid, stream))
            self._open[rid] = stream
            self._inbox.put(("add", rid, ids, params, stream))
        return stream

    def _check_open(self) -> None:
        if self._closed:
            raise self.dead_error

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """vLLM's: ends the requests at the engine's next step (their pages go back then); each one's generate() yields
        a last output, finish_reason "abort". Each id is free at once, as in vLLM: a generate() reusing it right away
        runs a new request, which none of the old one's outputs reach. An id not running is left alone."""
        with self._lock:
            for rid in [request_id] if isinstance(request_id, str) else request_id:
                owner = self._open.pop(rid, None)
                if isinstance(owner, _Family):  # vLLM's: the parent's abort ends its children, their ids free too
                    for child, stream in owner.open.items():
                        if self._open.get(child) is stream:
                            del self._open[child]
                        self._abort(child, stream)
                elif owner is not None:
                    self._abort(rid, owner)

    def _abort(self, rid: str, stream: RequestStream | None = None) -> None:
        """abort() from any thread, a plain call. With `stream` (its consumer left): only while `rid` is still that
        stream's request. A consumer that broke out at the finished output closes its generator later (when it is
        collected), and the id may be running a new request by then, which was aborted in its place."""
        self._inbox.put(("abort", rid, stream))

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
        """Ends the loop: open streams and generate() calls raise EngineDeadError (stopped), their requests aborted;
        later calls are refused with it. The LLM is shut down too where from_engine_args built it."""
        self._stop.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout=30)
        if self._owns_llm and not self._thread.is_alive():  # (a thread still inside a step owns the engine)
            self.llm.shutdown()

    def _busy(self) -> bool:
        return self.llm.has_work()

    def _stopping(self) -> bool:
        return self._stop.is_set()

    def _step(self) -> None:
        outs, reqs = self.llm.step(), self.llm.engine.reqs
        if self._ending:
            self._ending = {rid for rid in self._ending if rid in reqs}
        for out in outs:
            stream = self._streams.get(out.rid)
            if stream is None or (stream.final_only and not out.finished):
                continue
            if out.finished:  # its id is free before its caller hears of the end: it may reuse it at once
                del self._streams[out.rid]
                if out.rid in reqs:  # a stop string ended it in the text: the engine drops it at its next step
                    self._ending.add(out.rid)
                with self._lock:
                    self._release(out.rid, stream)
            stream.put(out)
            if out.finished:
                stream.put(END)

    def _release(self, rid: str, stream: RequestStream) -> None:
        """Under _lock: `rid` is free, unless abort() freed it already and a new request holds it; its parent's too
        once it was the last child open."""
        if self._open.get(rid) is stream:
            del self._open[rid]
        family = self._family_of.pop(stream, None)
        if family is not None:
            del family.open[rid]
            if not family.open and self._open.get(family.rid) is family:
                del self._open[family.rid]

    def _receive(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self.IDLE_TICK) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind = item[0]
            if kind == "add":
                _, rid, ids, params, stream = item
                # Its id's last request is still in the engine: a stop string ended it (the engine drops it at its
                # next step), or abort() freed the id (queued before this, ending it at that step). That step hands
                # the old stream its last output before this request takes the id.
                if rid in self._ending or rid in self._streams:
                    try:
                        self._step()
                    except BaseException:  # the engine crashed: the loop's end fails this request with the rest
                        self._inbox.put(item)
                        raise
                try:
                    self.llm.add_request(ids, params, rid)
                    self._streams[rid] = stream
                except Exception as e:
                    stream.put(ValueError(str(e)))
                    with self._lock:
                        self._release(rid, stream)
            elif kind == "abort" and (open_ := self._streams.get(item[1])) is not None:
                if item[2] is None or item[2] is open_:
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


AsyncLLMEngine = AsyncLLM  # vLLM's name of old (vllm.engine.async_llm_engine), the same class there now
