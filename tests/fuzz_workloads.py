"""Random workloads driven through an engine one step at a time, and the promises checked on them: shared by the fuzz in
one process (tests/test_fuzz_engine.py, hypothesis draws) and the tensor-parallel one (tests/tp_fuzz.py under torchrun,
seeded draws)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from engine.llm import LLM, RequestOutput
from engine.request import Status
from engine.sampling_params import SamplingParams
from tests.conftest import make_llm

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
    """An engine setting; the fields are EngineConfig's (`make_llm(model, **setting.engine_kwargs())`)."""

    page_size: int
    num_pages: int
    max_batch_tokens: int
    radix_cache: bool
    overlap: bool
    max_running_requests: int
    mixed_batch: bool
    max_running_tokens: int | None
    mixed_prefill_tokens: int

    def engine_kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


MemoKey = tuple[tuple[int, ...], int | None, tuple[str, ...], tuple[int, ...]]


class Reference:
    """Each request run alone on a large pool (no radix cache, one request at a time), memoized. With `margin`, each
    run also reports its top two log-probabilities per token, and near_tie() says which tokens won by less than that:
    in bf16 a batch of another size may round a near-tie the other way (docs/gpu.md)."""

    def __init__(
        self, model: str | LLM | None, memo: dict[MemoKey, RequestOutput] | None = None, margin: float | None = None
    ):
        """model: a model for a CPU engine of the reference's own, or the engine to run on (the GPU fuzz builds
        its own); None: answers from `memo` alone (a torchrun rank, which cannot start a TP=1 engine)."""
        self.llm = model if isinstance(model, LLM) or model is None else None
        if isinstance(model, str):
            self.llm = make_llm(model, num_pages=4096, page_size=16, radix_cache=False, max_running_requests=1)
        self.memo: dict[MemoKey, RequestOutput] = memo or {}
        self.margin = margin

    def run(self, prompt: tuple[int, ...], p: SamplingParams) -> RequestOutput:
        key = (prompt, p.max_tokens, tuple(p.stop), tuple(p.stop_token_ids))
        if key not in self.memo:
            assert self.llm is not None, f"no reference computed for {key}"
            asked = dataclasses.replace(p, logprobs=2) if self.margin is not None else p
            # without the tokenizer's bound method, so that the memo pickles for another process
            self.memo[key] = dataclasses.replace(self.llm.generate([list(prompt)], asked)[0], token_texts=None)
        return self.memo[key]

    def near_tie(self, out: RequestOutput, i: int) -> bool:
        """Whether out's token i won by less than the margin (a batch may pick the runner-up there); never without
        one."""
        if self.margin is None:
            return False
        assert out.logprobs is not None
        top = out.logprobs[i].top
        return top[0][1] - top[1][1] < self.margin

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


def check_outputs(run: Run, arrivals: list[Arrival], reference: Reference, setting: Setting) -> int:
    """Every request ended exactly once, its outputs only appended, with the tokens, text and finish reason of the
    same request run alone (a prefix of them if aborted); cache hits are whole pages. With the reference's margin,
    a request's tokens may part from those run alone at a near-tie of the reference's, and are compared up to there.
    Returns how many parted so."""
    parted = 0
    assert len(run.outputs) == len(arrivals)
    for rid, outs in run.outputs.items():
        a = run.arrival[rid]
        assert outs and [o.finished for o in outs] == [False] * (len(outs) - 1) + [True], rid
        final = outs[-1]
        seen: Sequence[int] = []
        for o in outs:  # the stream only ever appends, and each delta is exactly what was appended
            assert o.token_ids[: len(seen)] == seen and o.delta_token_ids == o.token_ids[len(seen) :], rid
            seen = o.token_ids
        want = reference.run(a.prompt, reference.params(a))
        # The first token where the two part, which only a near-tie of the reference's may excuse: past it they go on
        # from other tokens. Compared up to the reference's first near-tie instead, the GPU fuzz's bf16 requests were
        # compared over a token or two (a near-tie within 0.5 nats is that close in most of them).
        part = next((i for i, (x, y) in enumerate(zip(final.token_ids, want.token_ids)) if x != y), None)
        if rid in run.aborted:
            assert final.finish_reason == "abort", (rid, final.finish_reason)
            assert part is not None or len(final.token_ids) <= len(want.token_ids), f"{rid}: aborted with more tokens"
        if part is not None:
            assert reference.near_tie(want, part), f"{rid}: token {part} differs from it run alone (no near-tie there)"
            assert final.error is None, (rid, final.error)
            parted += 1
        elif rid not in run.aborted:
            got = (final.finish_reason, final.error, final.token_ids, final.text)
            assert got == (want.finish_reason, None, want.token_ids, want.text), f"{rid} differs from it run alone"
        assert final.text == "".join(o.delta_text for o in outs)
        hit = final.cache_hit_tokens
        assert hit % setting.page_size == 0 and 0 <= hit < len(a.prompt), (rid, hit)
        assert setting.radix_cache or hit == 0
    return parted


def check_drained(llm: LLM, setting: Setting, finished: int) -> None:
    """Nothing runs or waits, no page is in use (all free without the radix cache), and the engine has finished
    `finished` requests in all and forgotten them."""
    m = llm.metrics()
    assert (m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0), m
    assert m.kv_pages_free + m.kv_pages_cached == m.kv_pages_total == setting.num_pages
    assert setting.radix_cache or m.kv_pages_free == m.kv_pages_total
    assert m.finished_requests == finished
    assert not llm.engine.reqs and not llm._text
    llm.engine.check()
