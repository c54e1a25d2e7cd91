"""The server's side of the engine: admission control, and per admitted request the delivery of its engine outputs to
its jobs' inboxes as they arrive (`_deliver`, called by RemoteLLM's receiver, not a task per stream) and a task that
sends chained jobs and aborts on client disconnect. These (not the HTTP handler) own the request's accounting, its
latency metrics and its abort, so those happen even when the handler never starts streaming or stops reading."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jinja2
from starlette.requests import Request

from engine.logprobs import TokenLogprob
from engine.metrics import EngineMetrics
from engine.remote_llm import RemoteLLM
from engine.sampling_params import SamplingParams
from engine.streams import END
from engine.text import Prompt, RequestOutput
from minisgl_cli.server.errors import APIError
from minisgl_cli.server.metrics import ServerMetrics

# /metrics waits this long for the engine's snapshot (it answers between steps), then serves the last one
METRICS_WAIT_S = 0.5
METRICS_TIMEOUT_S = 300.0  # a snapshot asked for during a step longer than this is given up on (asked again later)


@dataclass(eq=False, slots=True)
class Job:
    """One admitted request (one choice of one prompt) as its HTTP handler sees it."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    remote: RemoteLLM
    inbox: asyncio.Queue = field(default_factory=asyncio.Queue)  # RequestOutput | Exception
    finished: bool = False
    cancelled: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)  # its first output arrived, or it ended
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # its last output or its error arrived
    prompt_logprobs: Sequence[TokenLogprob] | None = None  # from its first output
    cache_hit_tokens: int = 0  # prompt tokens its prefill read from the prefix cache (from its outputs)
    times_seen: int = 0  # its token times already in the latency histograms

    def abort(self) -> None:
        self.cancelled = True
        self.remote.abort(self.rid)

    async def batches(self) -> AsyncIterator[list[RequestOutput]]:
        """Outputs up to and including the finished one, each time all that arrived since the last batch: a
        stream that fell behind catches up in one write. A consumer that stops early aborts the request."""
        try:
            while not self.finished:
                item = await self.inbox.get()
                batch: list[RequestOutput] = []
                while True:
                    if isinstance(item, Exception):
                        if batch:
                            yield batch
                        raise item
                    batch.append(item)
                    self.finished = item.finished
                    if self.finished or self.inbox.empty():
                        break
                    item = self.inbox.get_nowait()
                yield batch
        finally:
            if not self.finished:
                self.abort()

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        async for batch in self.batches():
            for out in batch:
                yield out


@dataclass(frozen=True, slots=True)
class JobSpec:
    prompt_ids: list[int]
    params: SamplingParams
    # index of an earlier job of the same prompt: this one goes to the engine once that one's prompt is in the
    # KV cache (its first token is out), so it reads the prompt's pages from the prefix cache instead of
    # prefilling them again
    after: int | None = None


class EngineClient:
    def __init__(
        self,
        remote: RemoteLLM,
        model_name: str,
        max_queued_requests: int | None = None,
        sampling_defaults: dict[str, Any] | None = None,
    ):
        assert remote.info is not None, "start() the RemoteLLM first"
        self.remote = remote
        self.model_name = model_name
        self.sampling_defaults = dict(sampling_defaults or {})  # for the fields a request leaves out
        self.max_running = remote.info.max_running_requests
        self.max_queued = max_queued_requests
        self.max_model_len = remote.info.limits.max_model_len
        self.max_request_tokens = remote.info.limits.max_request_tokens
        self.limits = remote.info.limits
        self.metrics = ServerMetrics(model_name)
        self.in_flight = 0  # admitted, not yet finished: running in the engine or queued for it
        self._tasks: set[asyncio.Task] = set()
        self._last_metrics: tuple[EngineMetrics, float] | None = None  # the engine's last snapshot, when asked for
        self._metrics_call: asyncio.Task[None] | None = None  # the snapshot asked for and not yet answered
        with contextlib.suppress(RuntimeError):  # a first snapshot now, so that a first scrape in a long step has one
            asyncio.get_running_loop()
            self._metrics_call = asyncio.create_task(self._fetch_metrics())

    @property
    def admission_limit(self) -> int | None:
        """The most jobs (choices of prompts) in flight at once; None: no limit."""
        return None if self.max_queued is None else self.max_running + self.max_queued

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(
                404,
                f"model {name!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a text, token list or chat conversation; ValueError for an empty or malformed one."""
        try:
            return self.remote.encode(prompt)
        except jinja2.TemplateError as e:  # templates may refuse a conversation (e.g. roles that do not alternate)
            raise ValueError(f"messages: the model's chat template refused them: {e}") from e

    def start(self, request: Request, specs: list[JobSpec]) -> list[Job]:
        """Admit a request's jobs, all or none (ValueError if the engine refuses one, EngineDeadError if the engine
        is gone; a 429 while the server is full). Jobs with `after` are sent to the engine later, by their task. The
        caller refuses more jobs than admission_limit first (a 400: retrying cannot help)."""
        limit = self.admission_limit
        if limit is not None and self.in_flight + len(specs) > limit:
            self.metrics.rejected += 1
            raise APIError(
                429,
                f"server is full: {self.in_flight} requests are running or queued and this one adds {len(specs)} "
                f"({self.limits_flags}); retry later",
                code="queue_full",
            )
        for spec in specs:  # the engine would refuse them later, after a 200 was sent: refuse them all now
            self.limits.check(spec.prompt_ids, spec.params)
        jobs = [Job(uuid.uuid4().hex, s.prompt_ids, s.params, self.remote) for s in specs]
        try:
            for job, spec in zip(jobs, specs):
                if spec.after is None:
                    self.remote.submit(job.prompt_ids, job.params, job.rid, sink=partial(self._deliver, job))
        except Exception:
            for job in jobs:
                job.ended.set()  # never counted in flight: what the engine still sends for it changes nothing
                job.abort()
            raise
        self.in_flight += len(jobs)
        later = [self._submit_after(job, jobs[spec.after]) for job, spec in zip(jobs, specs) if spec.after is not None]
        task = asyncio.create_task(self._serve(request, jobs, later))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return jobs

    @property
    def limits_flags(self) -> str:
        return f"--max-running-requests {self.max_running} + --max-queued-requests {self.max_queued}"

    def _deliver(self, job: Job, item: object) -> None:
        """One item of `job`'s engine stream (an output, END after the finished one, or an exception), as it arrives.
        It runs in RemoteLLM's receiver, which serves every request: a fault here ends this job alone."""
        try:
            if isinstance(item, RequestOutput):
                if not job.started.is_set():
                    job.prompt_logprobs = item.prompt_token_logprobs
                    job.started.set()
                job.cache_hit_tokens = item.cache_hit_tokens
                job.times_seen = self.metrics.observe(item, job.times_seen)
                job.inbox.put_nowait(item)
            elif item is END:
                self._end(job, finished=True)
            else:  # EngineDeadError, or the engine's refusal: the handler raises it
                job.inbox.put_nowait(item)
                self._end(job, finished=False)
        except Exception as e:
            job.inbox.put_nowait(e)
            self._end(job, finished=False)

    def _end(self, job: Job, finished: bool) -> None:
        if job.ended.is_set():
            return
        job.started.set()
        job.ended.set()
        self.in_flight -= 1
        if not finished:
            self.remote.abort(job.rid)

    async def _submit_after(self, job: Job, after: Job) -> None:
        """Send `job` once `after`, an earlier job of the same prompt, has its first token (its prompt is cached)."""
        try:
            await after.started.wait()
            if job.cancelled:  # the client went away before this one was sent: nothing to run
                job.inbox.put_nowait(RequestOutput(job.rid, job.prompt_ids, [], "", "", [], True, "abort"))
                self._end(job, finished=True)
                return
            self.remote.submit(job.prompt_ids, job.params, job.rid, sink=partial(self._deliver, job))
        except Exception as e:  # EngineDeadError, or the engine's refusal of a later job: hand it to the handler
            job.inbox.put_nowait(e)
            self._end(job, finished=False)
        finally:
            if not job.ended.is_set() and job.rid not in self.remote.pending:  # cancelled before it was sent
                self._end(job, finished=False)

    async def _serve(self, request: Request, jobs: list[Job], later: list[Coroutine[Any, Any, None]]) -> None:
        watcher = asyncio.create_task(self._abort_on_disconnect(request, jobs))
        try:
            await asyncio.gather(*later)
            for job in jobs:
                await job.ended.wait()
        finally:
            watcher.cancel()

    async def _abort_on_disconnect(self, request: Request, jobs: list[Job]) -> None:
        # The body is already read, so the next ASGI message is the disconnect (or the end of the response,
        # by which time this task is cancelled).
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for job in jobs:
            job.abort()

    async def engine_metrics(self) -> tuple[EngineMetrics | None, float]:
        """A consistent snapshot, taken by the engine between steps, and its age in seconds. The engine answers
        between steps, so during a long one (a big prefill takes seconds on a CPU) this waits METRICS_WAIT_S, then
        returns the last snapshot: a scrape is answered promptly and never loses the engine's figures (Prometheus
        gives up on a scrape after 10 s). The request stays out and refreshes the snapshot once the step is over.
        (None, 0.0) if the engine is gone or has not answered yet."""
        if not self.remote.alive:
            return None, 0.0
        if self._metrics_call is None or self._metrics_call.done():
            self._metrics_call = asyncio.create_task(self._fetch_metrics())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._metrics_call), METRICS_WAIT_S)
        if self._last_metrics is None or not self.remote.alive:
            return None, 0.0
        snapshot, taken = self._last_metrics
        return snapshot, time.monotonic() - taken

    async def _fetch_metrics(self) -> None:
        sent = time.monotonic()
        snapshot = await self.remote.metrics(timeout=METRICS_TIMEOUT_S)
        if snapshot is not None:
            self._last_metrics = snapshot, sent
