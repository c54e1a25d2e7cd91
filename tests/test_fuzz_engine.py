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
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.llm import LLM, RequestOutput
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
    """Each request run alone on a large pool (no radix cache, one request at a time), memoized."""

    def __init__(self, model: str):
        self.llm = make_llm(model, num_pages=4096, page_size=16, radix_cache=False, max_running_requests=1)
        self.memo: dict[tuple, RequestOutput] = {}

    def run(self, prompt: tuple[int, ...], p: SamplingParams) -> RequestOutput:
        key = (prompt, p.max_tokens, tuple(p.stop), tuple(p.stop_token_ids))
        if key not in self.memo:
            self.memo[key] = self.llm.generate([list(prompt)], p)[0]
        return self.memo[key]

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
    return Reference(tiny_dir)


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


def drive(llm: LLM, arrivals: list[Arrival], too_big: Arrival | None, reference: Reference) -> Run:
    """Add, abort and step as the workload says, checking the bookkeeping after every step."""
    by_step: dict[int, list[Arrival]] = {}
    for a in arrivals:
        by_step.setdefault(a.step, []).append(a)
    run = Run({}, {}, set())
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

    assert len(run.outputs) == len(arrivals)
    for rid, outs in run.outputs.items():
        a = run.arrival[rid]
        assert outs and [o.finished for o in outs] == [False] * (len(outs) - 1) + [True], rid
        final = outs[-1]
        seen: list[int] = []
        for o in outs:  # the stream only ever appends, and each delta is exactly what was appended
            assert o.token_ids[: len(seen)] == seen and o.delta_token_ids == o.token_ids[len(seen) :], rid
            seen = o.token_ids
        want = reference.run(a.prompt, reference.params(a))
        if rid in run.aborted:
            assert final.finish_reason == "abort", (rid, final.finish_reason)
            assert final.token_ids == want.token_ids[: len(final.token_ids)], f"{rid}: aborted with wrong tokens"
        else:
            got = (final.finish_reason, final.error, final.token_ids, final.text)
            assert got == (want.finish_reason, None, want.token_ids, want.text), f"{rid} differs from it run alone"
            assert final.text == "".join(o.delta_text for o in outs)
        hit = final.cache_hit_tokens
        assert hit % setting.page_size == 0 and 0 <= hit < len(a.prompt), (rid, hit)
        assert setting.radix_cache or hit == 0

    m = llm.metrics()
    assert (m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0), m
    assert m.kv_pages_free + m.kv_pages_cached == m.kv_pages_total == setting.num_pages
    assert setting.radix_cache or m.kv_pages_free == m.kv_pages_total
    assert m.finished_requests == len(arrivals)
    assert not llm.engine.reqs and not llm._text
    llm.engine.check()
    for what, happened in (
        ("preempted", m.preemptions > 0),
        ("radix hit", m.cache_hit_tokens > 0),
        ("aborted", bool(run.aborted)),
        ("refused one", too_big is not None),
        ("stopped", any(o[-1].finish_reason == "stop" for o in run.outputs.values())),
    ):
        event(f"{what}: {happened}")  # pytest --hypothesis-show-statistics shows how often each case came up
