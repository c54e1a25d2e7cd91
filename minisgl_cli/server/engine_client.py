"""The server's side of the engine: admission control, and one task per admitted request that drains its engine
stream. The task (not the HTTP handler) owns the request's accounting, its latency metrics and its abort on
client disconnect, so those happen even when the handler never starts streaming or stops reading."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
from starlette.requests import Request

from engine.logprobs import TokenLogprob
from engine.metrics import EngineMetrics
from engine.remote_llm import RemoteLLM
from engine.sampling_params import SamplingParams
from engine.streams import RequestStream
from engine.text import Prompt, RequestOutput
from minisgl_cli.server.errors import APIError
from minisgl_cli.server.metrics import ServerMetrics


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
    prompt_logprobs: Sequence[TokenLogprob] | None = None  # from its first output

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
    def __init__(self, remote: RemoteLLM, model_name: str, max_queued_requests: int | None = None):
        assert remote.info is not None, "start() the RemoteLLM first"
        self.remote = remote
        self.model_name = model_name
        self.max_running = remote.info.max_running_requests
        self.max_queued = max_queued_requests
        self.max_model_len = remote.info.limits.max_model_len
        self.max_request_tokens = remote.info.limits.max_request_tokens
        self.limits = remote.info.limits
        self.metrics = ServerMetrics(model_name)
        self.in_flight = 0  # admitted, not yet finished: running in the engine or queued for it
        self._tasks: set[asyncio.Task] = set()

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
        is gone). Jobs with `after` are sent to the engine later, by their task."""
        if self.max_queued is not None and self.in_flight + len(specs) > self.max_running + self.max_queued:
            self.metrics.rejected += 1
            raise APIError(
                429,
                f"server is full: {self.in_flight} requests are running or queued and this one adds {len(specs)} "
                f"(--max-running-requests {self.max_running} + --max-queued-requests {self.max_queued}); retry later",
                code="queue_full",
            )
        for spec in specs:  # the engine would refuse them later, after a 200 was sent: refuse them all now
            self.limits.check(spec.prompt_ids, spec.params)
        jobs = [Job(uuid.uuid4().hex, s.prompt_ids, s.params, self.remote) for s in specs]
        streams: list[RequestStream | None] = []
        try:
            for job, spec in zip(jobs, specs):
                streams.append(self.remote.submit(job.prompt_ids, job.params, job.rid) if spec.after is None else None)
        except Exception:
            for job in jobs:
                job.abort()
            raise
        self.in_flight += len(jobs)
        pumps = [
            self._pump(job, stream, None if spec.after is None else jobs[spec.after])
            for job, stream, spec in zip(jobs, streams, specs)
        ]
        task = asyncio.create_task(self._serve(request, jobs, pumps))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return jobs

    async def _serve(self, request: Request, jobs: list[Job], pumps: list[Coroutine[Any, Any, None]]) -> None:
        watcher = asyncio.create_task(self._abort_on_disconnect(request, jobs))
        try:
            await asyncio.gather(*pumps)
        finally:
            watcher.cancel()

    async def _pump(self, job: Job, stream: RequestStream | None, after: Job | None) -> None:
        done = False
        try:
            if stream is None:
                assert after is not None
                await after.started.wait()
                if job.cancelled:  # the client went away before this one was sent: nothing to run
                    done = True
                    job.inbox.put_nowait(RequestOutput(job.rid, job.prompt_ids, [], "", "", [], True, "abort"))
                    return
                stream = self.remote.submit(job.prompt_ids, job.params, job.rid)
            async for out in stream:
                if not job.started.is_set():
                    job.prompt_logprobs = out.prompt_logprobs
                    job.started.set()
                if out.finished:
                    done = True
                    self.metrics.observe(out)
                job.inbox.put_nowait(out)
        except Exception as e:  # EngineDeadError, or the engine's refusal of a later job: hand it to the handler
            job.inbox.put_nowait(e)
        finally:
            job.started.set()
            self.in_flight -= 1
            if not done:
                self.remote.abort(job.rid)

    async def _abort_on_disconnect(self, request: Request, jobs: list[Job]) -> None:
        # The body is already read, so the next ASGI message is the disconnect (or the end of the response,
        # by which time this task is cancelled).
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for job in jobs:
            job.abort()

    async def engine_metrics(self) -> EngineMetrics | None:
        """A consistent snapshot, taken by the engine between steps; None if the engine is gone."""
        return await self.remote.metrics()
