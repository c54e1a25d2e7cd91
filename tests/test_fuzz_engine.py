"""Property tests of the scheduler and the KV cache together, through the real engine, one step at a time.

Hypothesis draws a workload (arrival steps, prompts with and without shared prefixes and exact twins, output
lengths, aborts at random steps, now and then a request that can never fit) and an engine setting (tiny or large
KV pool, page size 1 or 16, chunked-prefill budget, radix cache on/off, overlap on/off, few or many running
requests). The engine asserts page accounting and radix lock counts after every step (check_invariants); this
file asserts that no request is lost or duplicated, that every request ends exactly once with a reason, that
slots and pages all come back, and that every request's greedy tokens equal a run of that request alone
(the driver and these checks: tests/fuzz_workloads.py, shared with the TP=2 fuzz in tests/test_tp.py).
MINISGL_SLOW=1 runs many more examples.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.llm import LLM
from tests.conftest import make_llm
from tests.fuzz_workloads import (
    MAX_TOKENS,
    VOCAB,
    Arrival,
    Reference,
    Setting,
    check_drained,
    check_outputs,
    drive,
)
from tests.test_engine import tiny_dir  # noqa: F401  (the peaked-weight tiny Llama fixture)

SLOW = bool(os.environ.get("MINISGL_SLOW"))


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


@pytest.fixture(scope="module")
def reference(tiny_dir) -> Reference:  # noqa: F811
    return Reference(tiny_dir)


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
    llm = make_llm(tiny_dir, **setting.engine_kwargs())
    run = drive(llm, arrivals, too_big, reference)
    check_outputs(run, arrivals, reference, setting)
    check_drained(llm, setting, finished=len(arrivals))
    m = llm.metrics()
    for what, happened in (
        ("preempted", m.preemptions > 0),
        ("radix hit", m.cache_hit_tokens > 0),
        ("aborted", bool(run.aborted)),
        ("refused one", too_big is not None),
        ("stopped", any(o[-1].finish_reason == "stop" for o in run.outputs.values())),
    ):
        event(f"{what}: {happened}")  # pytest --hypothesis-show-statistics shows how often each case came up


def test_tokens_are_compared_up_to_where_they_part_not_to_the_first_near_tie():
    """The GPU fuzz excuses a request whose tokens part from the reference's at a near-tie of the reference's. It
    compared them only up to the reference's first near-tie, which this model's bf16 logits have within a token or
    two in most requests: a request that went the same way at its first token's near-tie and then differed anywhere
    (a wrong token where the reference's pick won by nats) passed, and so did most requests whatever their tokens."""
    from engine.logprobs import TokenLogprob
    from engine.text import RequestOutput
    from tests.fuzz_workloads import Run, greedy

    def output(tokens: list[int], reason: str = "length") -> RequestOutput:
        return RequestOutput("req-0", [1, 2, 3], tokens, "", "", list(tokens), True, reason)

    a = Arrival(0, (1, 2, 3), 4, None)
    want = output([10, 11, 12, 13])
    gaps = [0.1, 3.0, 3.0, 0.2]  # the reference's best token won by 0.1 nats at token 0 and 0.2 at token 3
    want.logprobs = [TokenLogprob(t, -1.0, 1, ((t, -1.0), (t + 1, -1.0 - g))) for t, g in zip(want.token_ids, gaps)]
    reference = Reference(None, {(a.prompt, 4, (), ()): want}, margin=0.5)
    assert reference.params(a) == greedy(4)
    setting = Setting(16, 4, 64, False, False, 1, True, None, 1024)

    def check(tokens: list[int]) -> int:
        return check_outputs(Run({"req-0": a}, {"req-0": [output(tokens)]}, set()), [a], reference, setting)

    with pytest.raises(AssertionError, match="token 2 differs from it run alone"):
        check([10, 11, 77, 13])  # token 0 went the reference's way; token 2 won by 3 nats there
    assert check([10, 11, 12, 13]) == 0
    assert check([99, 98, 97, 96]) == 1  # parted at token 0's near-tie: what follows may differ
    assert check([10, 11, 12, 77]) == 1  # and at token 3's


def test_an_engine_kept_across_examples_is_not_kept_past_a_failed_one(tiny_dir, reference):  # noqa: F811
    """The GPU fuzz keeps an engine per setting across examples (kept_engine). An example that failed mid-workload
    left its requests in the engine, and the next example drawing it failed on them, whatever its own workload."""
    engines: dict[str, LLM] = {}
    setting = Setting(16, 8, 64, True, False, 1, True, None, 1024)

    def build() -> LLM:
        return make_llm(tiny_dir, **setting.engine_kwargs())

    fits = Arrival(1, (7, 8), 8, None)  # given as a request that can never fit: "DID NOT RAISE", two requests running
    with pytest.raises(BaseException, match="DID NOT RAISE"):
        with kept_engine(engines, "tight", build) as llm:
            drive(llm, [Arrival(0, (1, 2, 3), 8, None), Arrival(0, (4, 5, 6), 8, None)], fits, reference)
    arrivals = [Arrival(0, (9, 10, 11), 4, None)]
    with kept_engine(engines, "tight", build) as llm:
        before = llm.metrics()
        check_outputs(drive(llm, arrivals, None, reference), arrivals, reference, setting)
        check_drained(llm, setting, finished=before.finished_requests + 1)


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
    "heads of 128, tight, chunks of 16, mixed": dict(num_pages=12, max_batch_tokens=16, mixed_prefill_tokens=3),
}
# Settings run on peaked_model_d128, whose heads the CUDA decode takes on Hopper (the others: FlashInfer's decode)
D128_ENGINES = {"heads of 128, tight, chunks of 16, mixed"}
# nats between the reference's two best tokens, far above bf16's rounding of these logits: where a request's tokens
# part from the reference's, the reference's pick must have won by less
GPU_MARGIN = 0.5


def gpu_engine_config(model: str, name: str = "defaults", **kw: Any) -> EngineConfig:
    base: dict[str, Any] = dict(page_size=16, num_pages=256, max_running_requests=64, cuda_graph_max_bs=64)
    return EngineConfig(model=model, dtype="bfloat16", **(base | GPU_ENGINES[name] | kw))


def setting_of(cfg: EngineConfig) -> Setting:
    """The fuzz's record of an engine's setting (what the checks read: page size, pool, radix cache)."""
    assert cfg.num_pages is not None
    return Setting(
        cfg.page_size,
        cfg.num_pages,
        cfg.max_batch_tokens,
        cfg.radix_cache,
        cfg.overlap is not False,
        cfg.max_running_requests,
        cfg.mixed_batch,
        cfg.max_running_tokens,
        cfg.mixed_prefill_tokens or cfg.max_batch_tokens,
    )


@pytest.fixture(scope="module")
def gpu_engines() -> Iterator[dict[str, LLM]]:
    """The engines by GPU_ENGINES' name, each built when an example first draws it (and again after one failed)."""
    built: dict[str, LLM] = {}
    yield built
    for llm in built.values():
        llm.shutdown()


@contextlib.contextmanager
def kept_engine(engines: dict[str, LLM], name: str, build: Callable[[], LLM]) -> Iterator[LLM]:
    """engines[name] for one example, built if missing, and dropped if the example fails: it may have left requests
    in the engine, or the engine stopped, and the next examples drawing it failed on those (outputs of the failed
    example's requests), so that hypothesis, replaying the failing case on it, reported "Inconsistent results"
    (FlakyFailure) and not the case."""
    if name not in engines:
        engines[name] = build()
    try:
        yield engines[name]
    except BaseException:
        with contextlib.suppress(Exception):
            engines.pop(name).shutdown()
        raise


@pytest.fixture(scope="module")
def gpu_references() -> Iterator[Callable[[str, str], Reference]]:
    """The reference for an engine's model and KV dtype (an fp8 pool rounds every K and V it stores, prompts'
    included)."""
    built: dict[tuple[str, str], Reference] = {}

    def get(model: str, kv_cache_dtype: str) -> Reference:
        if (model, kv_cache_dtype) not in built:
            cfg = gpu_engine_config(model, radix_cache=False, max_running_requests=1, kv_cache_dtype=kv_cache_dtype)
            built[model, kv_cache_dtype] = Reference(LLM(cfg), margin=GPU_MARGIN)
        return built[model, kv_cache_dtype]

    yield get
    for ref in built.values():
        assert ref.llm is not None
        ref.llm.shutdown()


@st.composite
def gpu_workloads(draw, capacity: int) -> tuple[list[Arrival], Arrival | None]:
    arrivals = draw_arrivals(draw, draw(st.sampled_from([0, 0, 6, 40])))
    too_big = draw(st.none() | token_lists(1, 8).map(lambda p: Arrival(1, p, capacity, None)))
    return arrivals, too_big


def gpu_capacity(name: str) -> int:
    setting = setting_of(gpu_engine_config("unused", name))
    return setting.num_pages * setting.page_size


# One test per engine, each with its own examples: drawn as part of the example, hypothesis' derandomized draws gave
# one of the settings 1 example of 175 (an H200 at a7f9271)
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_ENGINES))
@settings(
    max_examples=150 if SLOW else 25,
    deadline=None,
    derandomize=not SLOW,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_workloads_keep_every_promise_on_the_gpu(request, gpu_engines, gpu_references, name, data):
    model = request.getfixturevalue("peaked_model_d128" if name in D128_ENGINES else "peaked_model")
    arrivals, too_big = data.draw(gpu_workloads(gpu_capacity(name)))
    build = lambda: LLM(gpu_engine_config(model, name, check_invariants=True))  # noqa: E731
    with kept_engine(gpu_engines, name, build) as llm:
        setting, before = setting_of(llm.engine.config), llm.metrics()
        reference = gpu_references(model, llm.engine.config.kv_cache_dtype)
        run = drive(llm, arrivals, too_big, reference)
        parted = check_outputs(run, arrivals, reference, setting)
        check_drained(llm, setting, finished=before.finished_requests + len(arrivals))
    m = llm.metrics()
    for what, happened in (
        ("preempted", m.preemptions > before.preemptions),
        ("radix hit", m.cache_hit_tokens > before.cache_hit_tokens),
        ("aborted", bool(run.aborted)),
        ("refused one", too_big is not None),
        ("stopped", any(o[-1].finish_reason == "stop" for o in run.outputs.values())),
        ("parted at a near-tie", parted > 0),
    ):
        event(f"{what}: {happened}")
