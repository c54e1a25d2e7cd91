"""Property tests of the scheduler and the KV cache together, through the real engine, one step at a time.

Hypothesis draws a workload (arrival steps, prompts with and without shared prefixes and exact twins, output
lengths, aborts at random steps, now and then a request that can never fit) and an engine setting (tiny or large
KV pool, page size 1 or 16, chunked-prefill budget, radix cache on/off, overlap on/off, few or many running
requests). The engine asserts page accounting and radix lock counts after every step (check_invariants); this
file asserts that no request is lost or duplicated, that every request ends exactly once with a reason, that
slots and pages all come back, and that every request's greedy tokens equal a run of that request alone.
MINISGL_SLOW=1 runs many more examples.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.llm import LLM, RequestOutput
from engine.metrics import EngineMetrics
from engine.request import Status
from engine.sampling_params import SamplingParams
from tests.conftest import make_llm
from tests.test_engine import tiny_dir  # noqa: F401  (the peaked-weight tiny Llama fixture)

SLOW = bool(os.environ.get("MINISGL_SLOW"))
VOCAB = 512
MAX_TOKENS = 24  # longest output drawn; the reference decodes this many and each request compares its prefix
MAX_STEPS = 5000  # a workload that has not drained by then is a livelock


@dataclass(frozen=True)
class Arrival:
    step: int  # engine step at which the request is added
    prompt: tuple[int, ...]
    max_tokens: int
    abort_after: int | None  # abort this many steps after arrival (None: let it finish)
    stop: tuple[str, int] | None = None  # ("token" | "text", where): a stop taken from the reference output


@dataclass(frozen=True)
class Setting:
    page_size: int
    num_pages: int
    max_batch_tokens: int
    radix_cache: bool
    overlap: bool
    max_running_requests: int
    mixed_batch: bool
    max_running_tokens: int | None
    mixed_prefill_tokens: int


tokens = st.integers(0, VOCAB - 1)


def token_lists(lo: int, hi: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Lengths spread evenly over [lo, hi] (plain st.lists favours short lists)."""
    return st.integers(lo, hi).flatmap(lambda n: st.lists(tokens, min_size=n, max_size=n).map(tuple))


def draw_arrivals(draw: st.DrawFn, last_arrival: int) -> list[Arrival]:
    """1-8 requests arriving by step `last_arrival`: prompts on one of two shared prefixes, fresh ones and exact twins;
    outputs of 1..MAX_TOKENS; some aborted at a random step, some ended by a stop taken from their own output."""
    prefixes = draw(st.lists(token_lists(1, 48), min_size=1, max_size=2))
    arrivals: list[Arrival] = []
    for _ in range(draw(st.integers(1, 8))):
        if arrivals and draw(st.integers(0, 3)) == 0:
            prompt = draw(st.sampled_from(arrivals)).prompt  # an exact twin of an earlier request
        else:
            prefix = draw(st.sampled_from([*prefixes, ()]))
            prompt = prefix + draw(token_lists(0 if prefix else 1, 40))
        arrivals.append(
            Arrival(
                draw(st.integers(0, last_arrival)),
                prompt,
                draw(st.integers(1, MAX_TOKENS)),
                draw(st.none() | st.integers(0, 20)),
                draw(st.none() | st.tuples(st.sampled_from(["token", "text"]), st.integers(0, MAX_TOKENS - 1))),
            )
        )
    return arrivals


@st.composite
def workloads(draw) -> tuple[Setting, list[Arrival], Arrival | None]:
    # The engine setting is drawn first: hypothesis draws late choices of a long example less evenly.
    page_size = draw(st.sampled_from([1, 16]))
    pool = draw(st.sampled_from(["largest", "a third", "largest+3", "4096 tokens"]))  # of all requests' pages
    prefill_budget = draw(st.sampled_from([1, 5, 16, 8192]) | st.integers(1, 64))
    radix, overlap, mixed = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    max_running = draw(st.sampled_from([1, 2, 3, 64]))
    running_tokens = draw(st.sampled_from([None, None, 1, 40, 120]))
    mixed_prefill = draw(st.sampled_from([1024, 1024, 1, 3, 16]))  # prefill tokens per step beside decoding
    last_arrival = draw(st.sampled_from([0, 0, 6, 40]))  # all at once (most contention) ... spread out (most reuse)

    arrivals = draw_arrivals(draw, last_arrival)
    pages = [-(-(len(a.prompt) + a.max_tokens) // page_size) for a in arrivals]
    largest = max(max(pages), 2)  # the pool must hold the largest request alone, or that request is refused
    num_pages = {
        "largest": largest,
        "a third": max(largest, sum(pages) // 3),
        "largest+3": largest + 3,
        "4096 tokens": 4096 // page_size,
    }[pool]
    setting = Setting(
        page_size, num_pages, prefill_budget, radix, overlap, max_running, mixed, running_tokens, mixed_prefill
    )
    # Now and then one request that can never fit the pool or the context: refused at admission, and the rest
    # must not notice.
    too_big = draw(st.none() | token_lists(1, 8).map(lambda p: Arrival(1, p, num_pages * page_size, None)))
    return setting, arrivals, too_big


class Reference:
    """Each request run alone on `llm` (a large pool, no radix cache, one request at a time), memoized. With `margin`,
    each run also reports its top two log-probabilities per token, and sure_of() counts the leading tokens that won by
    at least that much: in bf16 a batch of another size may round a near-tie the other way (docs/gpu.md)."""

    def __init__(self, llm: LLM, margin: float | None = None):
        self.llm, self.margin = llm, margin
        self.memo: dict[tuple, RequestOutput] = {}

    def run(self, prompt: tuple[int, ...], p: SamplingParams) -> RequestOutput:
        key = (prompt, p.max_tokens, tuple(p.stop), tuple(p.stop_token_ids))
        if key not in self.memo:
            asked = replace(p, logprobs=2) if self.margin is not None else p
            self.memo[key] = self.llm.generate([list(prompt)], asked)[0]
        return self.memo[key]

    def sure_of(self, out: RequestOutput) -> int:
        """How many of out's leading tokens any batch must reproduce."""
        if self.margin is None:
            return len(out.token_ids)
        assert out.logprobs is not None
        close = (i for i, lp in enumerate(out.logprobs) if lp.top[0][1] - lp.top[1][1] < self.margin)
        return next(close, len(out.token_ids))

    def params(self, a: Arrival) -> SamplingParams:
        """Greedy, with a stop token id or stop string picked from what this prompt generates."""
        p = greedy(a.max_tokens)
        if a.stop is None:
            return p
        kind, at = a.stop
        base = self.run(a.prompt, greedy(MAX_TOKENS))
        if kind == "token":
            p.stop_token_ids = [base.token_ids[at]]
        elif "\ufffd" not in (text := base.text[at % max(len(base.text), 1) :][:2]) and text:
            p.stop = [text]
        return p


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_dir) -> Reference:  # noqa: F811
    return Reference(make_llm(tiny_dir, num_pages=4096, page_size=16, radix_cache=False, max_running_requests=1))


def check_bookkeeping(llm: LLM, outstanding: set[str]) -> None:
    """Every request not yet reported finished is in exactly one scheduler queue, and nothing else is (but for
    requests a stop string ended: the engine frees those at the next step)."""
    s = llm.engine.scheduler
    queued = [r.rid for r in [*s.waiting, *s.prefilling, *s.running]]
    assert len(queued) == len(set(queued)), f"a request sits in two queues: {queued}"
    ending = {c[1] for c in llm.engine._commands if c[0] == "finish"}
    assert set(queued) == set(llm.engine.reqs), (queued, sorted(llm.engine.reqs))
    assert outstanding <= set(queued) <= outstanding | ending, (queued, outstanding, ending)
    assert all(r.status is Status.WAITING for r in s.waiting)
    live_slots = [r.slot for r in s.live]
    assert len(set(live_slots + s.free_slots)) == len(live_slots) + len(s.free_slots) == s.max_running


@dataclass
class Run:
    arrival: dict[str, Arrival]  # rid -> what was asked
    outputs: dict[str, list[RequestOutput]]  # rid -> every output, in order
    aborted: set[str]  # rids aborted while still running
    metrics_before: EngineMetrics  # the engine's counts before the run


def drive(llm: LLM, arrivals: list[Arrival], too_big: Arrival | None, reference: Reference) -> Run:
    """Add, abort and step as the workload says, checking the bookkeeping after every step."""
    by_step: dict[int, list[Arrival]] = {}
    for a in arrivals:
        by_step.setdefault(a.step, []).append(a)
    run = Run({}, {}, set(), llm.metrics())
    abort_at: dict[int, list[str]] = {}
    outstanding: set[str] = set()
    step = 0
    while step <= max(by_step) or outstanding or llm.has_work():  # stop strings end requests a step early
        for a in by_step.get(step, []):
            rid = llm.add_request(list(a.prompt), reference.params(a))
            assert rid not in run.outputs
            run.arrival[rid], run.outputs[rid] = a, []
            outstanding.add(rid)
            if a.abort_after is not None:
                abort_at.setdefault(step + a.abort_after, []).append(rid)
        if too_big is not None and step == too_big.step:
            with pytest.raises(ValueError, match="exceeds the (KV cache capacity|model's context length)"):
                llm.add_request(list(too_big.prompt), greedy(too_big.max_tokens))
        for rid in abort_at.get(step, []):
            if rid in outstanding:
                run.aborted.add(rid)
            llm.abort(rid)  # also for requests that already finished: must be a no-op
        for out in llm.step():
            assert out.rid in outstanding, f"output for {out.rid} after it finished (or never added)"
            run.outputs[out.rid].append(out)
            if out.finished:
                outstanding.discard(out.rid)
        check_bookkeeping(llm, outstanding)
        step += 1
        assert step < MAX_STEPS, f"no progress: {len(outstanding)} requests still outstanding"
    return run


@settings(
    max_examples=5000 if SLOW else 400,
    deadline=None,
    derandomize=not SLOW,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(case=workloads())
def test_random_workloads_keep_every_promise(tiny_dir, reference, case):  # noqa: F811
    setting, arrivals, too_big = case
    llm = make_llm(
        tiny_dir,
        page_size=setting.page_size,
        num_pages=setting.num_pages,
        max_batch_tokens=setting.max_batch_tokens,
        radix_cache=setting.radix_cache,
        overlap=setting.overlap,
        max_running_requests=setting.max_running_requests,
        mixed_batch=setting.mixed_batch,
        max_running_tokens=setting.max_running_tokens,
        mixed_prefill_tokens=setting.mixed_prefill_tokens,
    )
    run = drive(llm, arrivals, too_big, reference)
    check_promises(llm, run, too_big, reference, setting.page_size, setting.radix_cache)
    assert len(run.outputs) == len(arrivals) and llm.metrics().kv_pages_total == setting.num_pages


def check_promises(
    llm: LLM, run: Run, too_big: Arrival | None, reference: Reference, page_size: int, radix_cache: bool
) -> None:
    """What `run` must show once drained: every request ended exactly once, its stream only appended, and its tokens
    are those of the request run alone (aborted ones: a prefix of them); every page is back (the counts are this
    run's alone: an engine may have served earlier runs)."""
    before = run.metrics_before
    for rid, outs in run.outputs.items():
        a = run.arrival[rid]
        assert outs and [o.finished for o in outs] == [False] * (len(outs) - 1) + [True], rid
        final = outs[-1]
        seen: Sequence[int] = []
        for o in outs:  # the stream only ever appends, and each delta is exactly what was appended
            assert o.token_ids[: len(seen)] == seen and o.delta_token_ids == o.token_ids[len(seen) :], rid
            seen = o.token_ids
        want = reference.run(a.prompt, reference.params(a))
        sure = reference.sure_of(want)
        if rid in run.aborted:
            assert final.finish_reason == "abort", (rid, final.finish_reason)
            n = min(len(final.token_ids), sure)
            assert final.token_ids[:n] == want.token_ids[:n], f"{rid}: aborted with wrong tokens"
        elif sure == len(want.token_ids):
            got = (final.finish_reason, final.error, final.token_ids, final.text)
            assert got == (want.finish_reason, None, want.token_ids, want.text), f"{rid} differs from it run alone"
        else:  # past a near-tie of the reference's, the two may part: the tokens before it must agree
            assert final.error is None and final.token_ids[:sure] == want.token_ids[:sure], f"{rid}: wrong tokens"
        if rid not in run.aborted:
            event(f"tokens compared in full: {sure == len(want.token_ids)}")
        assert final.text == "".join(o.delta_text for o in outs)
        hit = final.cache_hit_tokens
        assert hit % page_size == 0 and 0 <= hit < len(a.prompt), (rid, hit)
        assert radix_cache or hit == 0

    m = llm.metrics()
    assert (m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0), m
    assert m.kv_pages_free + m.kv_pages_cached == m.kv_pages_total
    assert radix_cache or m.kv_pages_free == m.kv_pages_total
    assert m.finished_requests - before.finished_requests == len(run.outputs)
    assert not llm.engine.reqs and not llm._text
    llm.engine.check()
    for what, happened in (
        ("preempted", m.preemptions > before.preemptions),
        ("radix hit", m.cache_hit_tokens > before.cache_hit_tokens),
        ("aborted", bool(run.aborted)),
        ("refused one", too_big is not None),
        ("stopped", any(o[-1].finish_reason == "stop" for o in run.outputs.values())),
    ):
        event(f"{what}: {happened}")  # pytest --hypothesis-show-statistics shows how often each case came up


# ---- the same on a GPU: CUDA graphs (decode and piecewise), overlap, FlashInfer, the fused kernels, bf16 ----------

# Engines built once each (a GPU engine's start captures graphs) and drawn per example; each example must leave its
# engine with every page back, so the next one starts clean. The largest request is 112 tokens (an 88-token prompt
# and 24 outputs): the tight pools hold one or two, so requests wait and get preempted.
GPU_ENGINES: dict[str, dict[str, Any]] = {
    "defaults": dict(),
    "tight pool, chunks of 16, mixed": dict(num_pages=12, max_batch_tokens=16, mixed_prefill_tokens=3),
    "page 1, chunks of 5, prefill first": dict(page_size=1, num_pages=230, max_batch_tokens=5, mixed_batch=False),
    "no overlap, no radix, 2 running": dict(overlap=False, radix_cache=False, max_running_requests=2),
    "eager overlap, token cap": dict(cuda_graph_max_bs=0, piecewise_graph_tokens=0, max_running_tokens=40),
    "3 running, tight, chunks of 7": dict(num_pages=9, max_running_requests=3, max_batch_tokens=7),
    "fp8 pool, tight, chunks of 16": dict(kv_cache_dtype="fp8", num_pages=12, max_batch_tokens=16),
}
GPU_MARGIN = 0.5  # nats between the reference's two best tokens, far above bf16's rounding of these logits


def gpu_engine_config(model: str, name: str = "defaults", **kw: Any) -> EngineConfig:
    base: dict[str, Any] = dict(page_size=16, num_pages=256, max_running_requests=64, cuda_graph_max_bs=64)
    return EngineConfig(model=model, dtype="bfloat16", **(base | GPU_ENGINES[name] | kw))


@pytest.fixture(scope="module")
def gpu_engines(peaked_model: str) -> Iterator[Callable[[str], LLM]]:
    built: dict[str, LLM] = {}

    def get(name: str) -> LLM:
        if name not in built:
            built[name] = LLM(gpu_engine_config(peaked_model, name, check_invariants=True))
        return built[name]

    yield get
    for llm in built.values():
        llm.shutdown()


@pytest.fixture(scope="module")
def gpu_references(peaked_model: str) -> Iterator[Callable[[str], Reference]]:
    """The reference for an engine's KV dtype (an fp8 pool rounds every K and V it stores, prompts' included)."""
    built: dict[str, Reference] = {}

    def get(kv_cache_dtype: str) -> Reference:
        if kv_cache_dtype not in built:
            cfg = gpu_engine_config(
                peaked_model, radix_cache=False, max_running_requests=1, kv_cache_dtype=kv_cache_dtype
            )
            built[kv_cache_dtype] = Reference(LLM(cfg), margin=GPU_MARGIN)
        return built[kv_cache_dtype]

    yield get
    for ref in built.values():
        ref.llm.shutdown()


@st.composite
def gpu_workloads(draw) -> tuple[str, list[Arrival], Arrival | None]:
    name = draw(st.sampled_from(sorted(GPU_ENGINES)))
    arrivals = draw_arrivals(draw, draw(st.sampled_from([0, 0, 6, 40])))
    cfg = gpu_engine_config("unused", name)
    assert cfg.num_pages is not None
    capacity = cfg.num_pages * cfg.page_size
    too_big = draw(st.none() | token_lists(1, 8).map(lambda p: Arrival(1, p, capacity, None)))
    return name, arrivals, too_big


@pytest.mark.gpu
@settings(
    max_examples=1000 if SLOW else 175,
    deadline=None,
    derandomize=not SLOW,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(case=gpu_workloads())
def test_random_workloads_keep_every_promise_on_the_gpu(gpu_engines, gpu_references, case):
    name, arrivals, too_big = case
    llm = gpu_engines(name)
    cfg = llm.engine.config
    reference = gpu_references(cfg.kv_cache_dtype)
    run = drive(llm, arrivals, too_big, reference)
    check_promises(llm, run, too_big, reference, cfg.page_size, cfg.radix_cache)
    event(f"engine: {name}")
