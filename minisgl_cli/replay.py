"""Sending timed requests and timing their tokens: in-process through AsyncLLM, or to an OpenAI-compatible server
through the project's streaming client. bench-trace and bench-serve both drive their runs through `drive`.

Latencies count from each request's scheduled send time, not from when the client got round to sending it: time in
the client's own queue (a late wake-up, a busy event loop, a request waiting for a --max-concurrency slot while the
arrival process runs on) is part of what a user would wait. In a closed loop (no pacing, a concurrency cap) a request
is scheduled when a slot frees."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.gc_heap import frozen_heap
from minisgl_cli.openai_client import HTTPStatusError
from minisgl_cli.prometheus import cache_counters, parse_prometheus

OnDone = Callable[["RequestResult"], None]
Until = Callable[["RequestResult"], bool]  # asked of each request as it ends; True: stop the run (see `drive`)


@dataclass(slots=True)
class ReplayItem:
    index: int
    line: int
    arrival: float  # seconds from the run's start (already scaled); unused in a closed loop
    prompt: list[int] | str
    output_len: int
    input_len: int | None = None  # token count of a text prompt, when known


@dataclass(slots=True)
class RequestResult:
    index: int
    line: int
    input_len: int
    expected_output: int
    scheduled: float = 0.0  # perf_counter when it was due to be sent; the latencies count from here
    sent: float = 0.0  # perf_counter when it was sent
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)  # gaps between token (or chunk) arrivals
    e2e: float | None = None
    output_tokens: int = 0
    cache_hit_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.e2e is None or self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def set_times(self, times: Sequence[float]) -> None:
        if times:
            self.ttft, self.e2e = times[0] - self.scheduled, times[-1] - self.scheduled
            self.itls = [b - a for a, b in zip(times, times[1:])]


@dataclass(slots=True)
class LiveCounters:
    """What a progress view reads while a run goes on (plain counters: cheap to bump per token)."""

    sent: int = 0
    in_flight: int = 0
    tokens: int = 0  # tokens (in-process) or token-carrying events (URL) received
    done: list[RequestResult] = field(default_factory=list)
    started: float = 0.0  # the run's start on the perf_counter clock, set by drive


Sender = Callable[[ReplayItem, RequestResult, LiveCounters], Awaitable[None]]


async def _wait_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


# Prompt tokens an open loop holds ready ahead of their sends: a lazy workload (bench-trace's, synthesized as it is
# read) is built this far ahead, before the clock starts and while waiting for the next send, not all up front (the
# whole Mooncake trace at a 128k context took ~6 GB of token lists before its first request went out).
LOOKAHEAD_TOKENS = 1 << 20


class Workload(Protocol):
    """The items to send, in arrival order: a list, or a sequence whose items (prompts) are made as it is iterated."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[ReplayItem]: ...


@dataclass(slots=True)
class _Ahead:
    """The open loop's items taken from the workload and not yet sent: at most LOOKAHEAD_TOKENS of prompt tokens
    (at least one item)."""

    source: Iterator[ReplayItem]
    queue: deque[ReplayItem] = field(default_factory=deque)
    tokens: int = 0
    ended: bool = False

    def pull(self) -> bool:
        """Take (make) the next item, if within the budget; False when full or out of items."""
        if self.ended or (self.queue and self.tokens >= LOOKAHEAD_TOKENS):
            return False
        item = next(self.source, None)
        if item is None:
            self.ended = True
            return False
        self.queue.append(item)
        self.tokens += len(item.prompt)
        return True

    def pop(self) -> ReplayItem | None:
        if not self.queue:
            self.pull()
        if not self.queue:
            return None
        item = self.queue.popleft()
        self.tokens -= len(item.prompt)
        return item


async def drive(
    items: Workload,
    send: Sender,
    max_concurrency: int | None = None,
    closed_loop: bool = False,
    duration: float | None = None,
    live: LiveCounters | None = None,
    on_done: OnDone | None = None,
    until: Until | None = None,
) -> list[RequestResult]:
    """Send every item at the run's start (`live.started`) + item.arrival (open loop, a semaphore for the cap) or,
    closed loop, as soon as one of max_concurrency slots is free until the items run out or `duration` passes.
    Results of the requests sent, in the items' order. The items come in arrival order, and are taken from `items`
    as they come due: an open loop holds the next LOOKAHEAD_TOKENS of prompts ready (the first of them taken before
    the clock starts), a closed loop takes each as a slot frees, before its clock.

    `until`, asked of each request as it ends: once it says True, nothing more is sent and the requests in flight are
    cancelled (a stream dropped, an in-process request aborted); the results are then those of the requests that
    ended, and `live.sent - len(live.done)` counts the cancelled ones (in no result: neither completed nor failed).

    The client's full collections are held back while it runs, as the engine's are (engine/gc_heap.py): its heap
    holds every prompt and every token's arrival time, and a full pass would stall every stream it times. The
    collection before the freeze comes before the clock starts."""
    live = live or LiveCounters()
    ahead = None if closed_loop else _Ahead(iter(items))
    while ahead is not None and ahead.pull():  # before the heap is frozen: the full collections never walk them
        pass
    with frozen_heap():
        live.started = time.perf_counter()
        return await _drive(items, ahead, send, max_concurrency, closed_loop, duration, live, on_done, until)


async def _drive(
    items: Workload,
    ahead: _Ahead | None,
    send: Sender,
    max_concurrency: int | None,
    closed_loop: bool,
    duration: float | None,
    live: LiveCounters,
    on_done: OnDone | None,
    until: Until | None,
) -> list[RequestResult]:
    t0 = live.started
    halted = False  # `until` said so: every send below is cancelled
    sends: asyncio.Future[list[Any]]
    out: list[RequestResult] = []  # a closed loop's results, in the order they ended

    async def run(item: ReplayItem, scheduled: float) -> RequestResult:
        nonlocal halted
        res = RequestResult(item.index, item.line, item.input_len or len(item.prompt), item.output_len)
        res.scheduled = scheduled
        live.sent += 1
        live.in_flight += 1
        try:
            await send(item, res, live)
        finally:
            live.in_flight -= 1
        live.done.append(res)
        if on_done:
            on_done(res)
        if until is not None and not halted and until(res):
            halted = True
            sends.cancel()
        return res

    if closed_loop:
        assert max_concurrency is not None
        queue = iter(items)

        async def worker() -> None:
            for item in queue:
                now = time.perf_counter()
                # this worker's last request halted the run: the worker is cancelled at its next wait, once the
                # next request would have gone out
                if halted or (duration is not None and now - t0 >= duration):
                    return
                out.append(await run(item, now))

        # no more workers than requests: a cap of 300,000 meant as "no cap" started as many tasks, which kept the
        # event loop from the streams it times (TTFT 51.7 ms at a cap of 4 against 1,525 ms at 1,000,000)
        sends = asyncio.gather(*(worker() for _ in range(min(max_concurrency, len(items)))))
    else:
        assert ahead is not None
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def one(item: ReplayItem, scheduled: float) -> RequestResult:
            if slots is None:
                return await run(item, scheduled)
            async with slots:
                return await run(item, scheduled)

        async def pace(ahead: _Ahead) -> list[RequestResult]:
            tasks: list[asyncio.Task[RequestResult]] = []
            try:
                while True:
                    if not ahead.queue:  # the requests started go out before the next is made
                        await asyncio.sleep(0)
                    if (item := ahead.pop()) is None:
                        break
                    due = t0 + item.arrival
                    while time.perf_counter() < due and ahead.pull():  # the next ones made while this one waits
                        await asyncio.sleep(0)
                    await _wait_until(due)
                    tasks.append(asyncio.create_task(one(item, due)))
                return list(await asyncio.gather(*tasks))
            except asyncio.CancelledError:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

        sends = asyncio.ensure_future(pace(ahead))
    try:
        ended = await sends
    except asyncio.CancelledError:
        # cancelled by `until` above, or from outside (Ctrl-C cancels the run's task): only the latter goes on up
        task = asyncio.current_task()
        if not halted or (task is not None and task.cancelling()):
            raise
        return sorted(live.done, key=lambda r: r.index)
    return sorted(out, key=lambda r: r.index) if closed_loop else list(ended)


async def drive_or_interrupted(
    items: Workload, send: Sender, live: LiveCounters, **kwargs
) -> tuple[list[RequestResult], bool]:
    """`drive`, or, when Ctrl-C cancels it (asyncio.run cancels its main task on SIGINT), the requests finished by
    then and True: the caller reports them as partial results rather than losing the run."""
    try:
        return await drive(items, send, live=live, **kwargs), False
    except asyncio.CancelledError:
        return sorted(live.done, key=lambda r: r.index), True


def failure(e: BaseException, timeout: float | None = None, received: int = 0) -> str:
    """A failed request's error; `received`: the chunks its stream had carried when it failed."""
    if isinstance(e, TimeoutError):
        if timeout and received:  # it was answering, too slowly for the timeout ("no answer" sent users to the network)
            return f"TimeoutError: not finished within {timeout:g} s ({received:,} chunks received)"
        return f"TimeoutError: no answer within {timeout:g} s" if timeout else "TimeoutError"
    return f"{type(e).__name__}: {e}"


# ---- in-process ------------------------------------------------------------------------------------------
def local_sender(async_llm, temperature: float, chat: bool = False, token_stream: bool = True) -> Sender:
    """token_stream=False: each request's finished output alone (token times are the engine's either way), so the
    client's loop does not wake once per token and request on the engine's interpreter lock."""
    from engine.sampling_params import SamplingParams

    async def send(item: ReplayItem, res: RequestResult, live: LiveCounters) -> None:
        loop = asyncio.get_running_loop()
        res.sent = time.perf_counter()
        last = None
        prompt = [{"role": "user", "content": item.prompt}] if chat else item.prompt
        try:
            params = SamplingParams(max_tokens=item.output_len, temperature=temperature, ignore_eos=True)
            async for out in async_llm.submit(prompt, params, loop=loop, final_only=not token_stream):
                live.tokens += len(out.delta_token_ids) if token_stream else len(out.token_ids)
                last = out
        except Exception as e:  # a bad request (ValueError) or a dead engine fails this request only
            res.error = failure(e)
        if last is not None:
            res.output_tokens, res.cache_hit_tokens = len(last.token_ids), last.cache_hit_tokens
            res.input_len = len(last.prompt_token_ids)
            res.set_times(last.token_times)
            if last.finish_reason not in ("length", "stop") and res.error is None:
                res.error = f"finished with {last.finish_reason}: {last.error or ''}".strip()

    return send


# ---- OpenAI-compatible server ------------------------------------------------------------------------------
def url_sender(client, model: str, temperature: float, chat: bool = False) -> Sender:
    """Streams /v1/completions (token-id or text prompts) or /v1/chat/completions (text as one user message) with
    `ignore_eos` and `stream_options.include_usage`; each event carrying text is timed as it arrives. Output (and
    prompt) token counts come from the final usage chunk when the server sends one, else from the event count."""
    path = "/v1/chat/completions" if chat else "/v1/completions"

    async def send(item: ReplayItem, res: RequestResult, live: LiveCounters) -> None:
        body = {
            "model": model,
            "max_tokens": item.output_len,
            "temperature": temperature,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        if chat:
            body["messages"] = [{"role": "user", "content": item.prompt}]
        else:
            body["prompt"] = item.prompt
        times: list[float] = []
        usage = None
        finished = None  # when the choice's finish_reason came
        res.sent = time.perf_counter()
        try:
            async with asyncio.timeout(client.timeout), aclosing(client.stream(path, body)) as events:
                async for ev in events:
                    # chunks read in one burst never give the loop back, so asyncio's timeout could not fire: a
                    # request whose last tokens came after its deadline completed (E2E 1.55 s under a 1 s timeout)
                    if ev.time - res.sent > client.timeout:
                        raise TimeoutError
                    # a thinking model's reasoning_content is output too (vLLM's bench serve times every chunk)
                    if ev.text or ev.reasoning:
                        times.append(ev.time)
                        live.tokens += 1
                    elif ev.finish_reason and finished is None:
                        finished = ev.time  # a finish chunk without text, timed below when it came last
                    if ev.usage:
                        usage = ev.usage
        except Exception as e:
            res.error = failure(e, client.timeout, len(times))
        res.output_tokens = int(usage["completion_tokens"]) if usage else len(times)
        late = finished if finished is not None and (not times or usage is not None and finished > times[-1]) else None
        if late is not None and res.error is None and (usage is None or res.output_tokens > 0):
            # Tokens whose text is empty (a special token, bytes that complete no character yet) send no event of
            # their own: they show up in the finish chunk, which then times them. An output made only of them has
            # no other event; one that ends with them ended there, not at its last text (E2E and TPOT stopped
            # short of its last tokens; vLLM's bench serve ends a request's latency at its last chunk, the finish
            # chunk included). Without usage the count is the events', so only the first case adds one.
            times.append(late)
            live.tokens += 1
            res.output_tokens = max(res.output_tokens, 1)
        if usage and usage.get("prompt_tokens"):
            res.input_len = int(usage["prompt_tokens"])
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        if isinstance(cached, int) and not isinstance(cached, bool):  # minisgl's and SGLang's servers send it
            res.cache_hit_tokens = cached
        res.set_times(times)
        if not times and res.error is None:
            res.error = "the stream carried no tokens"

    return send


# /v1/models' `owned_by` as the servers that answer this way set it: the engine behind a URL, for the result's record
KNOWN_OWNERS = ("minisgl", "vllm", "sglang")


async def served_model(client, name: str | None = None) -> tuple[str, str | None, int | None]:
    """The model to send (`name`, else the first /v1/models lists), the engine behind it by that listing's
    `owned_by` (KNOWN_OWNERS; None when it names none) and the context it lists (`max_model_len`, as vLLM's and
    minisgl's servers do; None when it lists none), from one request. With `name` given, a server without
    /v1/models is fine."""
    try:
        listed = await client.models()
    except (OSError, ValueError, HTTPStatusError):
        if name is None:
            raise
        return name, None, None
    if name is None:
        if not listed:
            raise ValueError(f"{client.url} /v1/models lists no model: pass --served-model")
        name = str(listed[0]["id"])
    entry: dict[str, Any] = next((m for m in listed if m.get("id") == name), {})
    owner, context = entry.get("owned_by"), entry.get("max_model_len")
    context = context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None
    return name, owner if owner in KNOWN_OWNERS else None, context


async def scrape_metrics(client) -> dict[str, float] | None:
    try:
        status, body = await client.get("/metrics")
    except Exception:
        return None
    return parse_prometheus(body.decode(errors="replace")) if status == 200 else None


def completed_hit_rate(results: Sequence[RequestResult]) -> float | None:
    """Hit tokens / prompt tokens of the completed requests, from each one's own cache hits; None when one of them
    has none (a server that does not report them) or none completed."""
    ok = [r for r in results if r.ok]
    if any(r.cache_hit_tokens is None for r in ok):
        return None
    prompt = sum(r.input_len for r in ok)
    return sum(r.cache_hit_tokens or 0 for r in ok) / prompt if prompt else None


def cache_hit_rate(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Hit tokens / prompt tokens over the replay, from counters scraped before and after (None if unknown). The
    counters count every prompt the server admitted: a request cut off or failed after its first prefill chunk, and
    any other client's, too."""
    if not before or not after:
        return None
    end = cache_counters(after)
    if end is None:
        return None
    start = cache_counters(before) or (0.0, 0.0)
    d_prompt = end[1] - start[1]
    return (end[0] - start[0]) / d_prompt if d_prompt > 0 else None
