"""Engine properties: same tokens under every scheduling/cache setting, exact page accounting, preemption."""

from __future__ import annotations

import collections
import random
import resource
import time

import pytest
import torch

from engine.model_config import PRESETS
from engine.sampling_params import SamplingParams
from kvcache.manager import RUN_PAGES
from tests.conftest import make_llm
from tests.hf_reference import hf_model_from_config, save_hf

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny Llama with peaked (not near-flat) random weights, so greedy choices are not float ties."""
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    return str(save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), path))


def prompts_with_shared_prefix(n: int = 8, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(512) for _ in range(40)]
    out = []
    for i in range(n):
        tail = [rng.randrange(512) for _ in range(rng.randint(3, 70))]
        out.append((system if i % 2 == 0 else []) + tail)
    return out


def run(model: str, prompts, params=GREEDY, **cfg):
    llm = make_llm(model, **cfg)
    outs = llm.generate(prompts, params)
    return [o.token_ids for o in outs], llm


def assert_all_pages_back(llm) -> None:
    m = llm.metrics()
    assert m.running == m.waiting == 0
    assert m.kv_pages_in_use == 0, m
    assert m.kv_pages_free + m.kv_pages_cached == m.kv_pages_total


def test_same_tokens_across_settings(tiny_dir):
    prompts = prompts_with_shared_prefix()
    base, llm = run(tiny_dir, prompts)
    assert_all_pages_back(llm)
    variants = {
        "prefill first": dict(mixed_batch=False),
        "prefill first, chunk 16": dict(mixed_batch=False, max_batch_tokens=16),
        "prefill first, no radix cache": dict(mixed_batch=False, radix_cache=False),
        "prefill first, page size 1, chunk 7": dict(mixed_batch=False, page_size=1, max_batch_tokens=7),
        "prefill first, overlap": dict(mixed_batch=False, overlap=True),
        "mixed batches, chunk 16": dict(max_batch_tokens=16),
        "mixed batches, no radix cache": dict(radix_cache=False),
        "mixed batches, page size 1": dict(page_size=1),
        "mixed batches, page size 1, chunk 7": dict(page_size=1, max_batch_tokens=7),
        "mixed batches, overlap": dict(overlap=True),
        "mixed batches, batch of 2": dict(max_running_requests=2),
        "mixed batches, chunk 16, no radix cache": dict(max_batch_tokens=16, radix_cache=False),
        "mixed batches, chunk 16, overlap": dict(max_batch_tokens=16, overlap=True),
        "mixed batches, chunk 16, 3 beside decoding": dict(max_batch_tokens=16, mixed_prefill_tokens=3),
        "mixed batches, chunk 16, 1 beside decoding, overlap": dict(
            max_batch_tokens=16, mixed_prefill_tokens=1, overlap=True
        ),
    }
    for name, cfg in variants.items():
        tokens, llm = run(tiny_dir, prompts, **cfg)
        assert tokens == base, name
        assert_all_pages_back(llm)
        mixed_steps = llm.metrics().mixed_steps
        if "mixed" not in name:
            assert mixed_steps == 0, name
        elif "chunk" in name:  # the first prompts decode while later ones still prefill
            assert mixed_steps > 0, name


@pytest.mark.parametrize("overlap", [True, False])
def test_mixed_batches_preempt_and_recompute_under_a_tiny_pool(tiny_dir, overlap):
    """Found by the fuzzed suite: a decode row preempted for lack of pages was re-admitted in the same step's prefill
    part while its last token was still in flight (overlap), so its pages were one short when the token landed."""
    prompts = [[0], [0, 0]]  # (its first form, [[0, 0], [0, 0]] at a 1-token budget, no longer preempts: the second
    # prompt is admitted only once a step has room for it; this one gives wrong tokens without the guard)
    cfgs = dict(page_size=1, num_pages=3, max_batch_tokens=2, radix_cache=False, max_running_requests=2)
    llm = make_llm(tiny_dir, mixed_batch=True, overlap=overlap, **cfgs)
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (2, 1)]
    outs = llm.generate(prompts, params)
    assert llm.metrics().preemptions > 0
    alone = [make_llm(tiny_dir, num_pages=64).generate([p], sp)[0].token_ids for p, sp in zip(prompts, params)]
    assert [o.token_ids for o in outs] == alone
    assert_all_pages_back(llm)


@pytest.mark.parametrize("mixed", [True, False])
def test_arriving_prompts_do_not_stall_running_streams_with_mixed_batches(tiny_dir, mixed):
    """A long prompt arrives while a request decodes. With mixed batches every step carries the running request's
    next token beside a prefill chunk of the new prompt; without, the prefill steps come first and the stream
    stalls for as long. The tokens are the same either way."""
    llm = make_llm(tiny_dir, max_batch_tokens=16, mixed_batch=mixed)
    prompts = prompts_with_shared_prefix(2, seed=3)
    first = llm.add_request(prompts[0][:8], GREEDY)
    llm.step()  # its prefill: it is decoding from now on
    second = llm.add_request(prompts[0][8:] * 3, GREEDY)  # > 80 tokens: several 16-token chunks
    outs: dict = {first: [], second: []}
    steps_until_second_starts = 0
    while not outs[second]:
        step = {o.rid: o for o in llm.step()}
        steps_until_second_starts += 1
        for rid, o in step.items():
            outs[rid].append(o)
        assert (first in step) == mixed, f"step {steps_until_second_starts}: running stream advanced: {first in step}"
    assert steps_until_second_starts >= 5
    assert llm.metrics().mixed_steps == (steps_until_second_starts if mixed else 0)
    while llm.has_work():
        for o in llm.step():
            outs[o.rid].append(o)
    alone = [run(tiny_dir, [p], max_batch_tokens=16)[0][0] for p in (prompts[0][:8], prompts[0][8:] * 3)]
    assert [outs[first][-1].token_ids, outs[second][-1].token_ids] == alone
    assert_all_pages_back(llm)


def test_steps_with_decoding_requests_add_at_most_mixed_prefill_tokens(tiny_dir):
    """--mixed-prefill-tokens: while requests decode, a step adds at most that many prefill tokens (each chunk
    lengthens every stream's step); with nothing decoding, prefill fills the whole --max-batch-tokens budget."""
    cap, budget = 5, 64
    prompts = prompts_with_shared_prefix(6, seed=4)
    llm = make_llm(tiny_dir, max_batch_tokens=budget, mixed_prefill_tokens=cap, check_invariants=True)
    llm.engine.step_records = []
    rids = [llm.add_request(p, GREEDY) for p in prompts]
    outs = {}
    while llm.has_work():
        for o in llm.step():
            outs[o.rid] = o.token_ids
    steps = llm.engine.step_records
    assert steps[0].decode_rows == 0 and steps[0].prefill_tokens == budget  # nothing decodes yet: the full budget
    beside = [s.prefill_tokens for s in steps if s.decode_rows and s.prefill_tokens]
    assert beside and max(beside) == cap, beside  # the rest of the prompts, 5 tokens per step
    assert sum(s.prefill_tokens for s in steps) == sum(len(p) for p in prompts) - llm.metrics().cache_hit_tokens
    assert [outs[r] for r in rids] == run(tiny_dir, prompts)[0]
    assert_all_pages_back(llm)
    # Unset (bench-offline): steps beside decoding take up to the whole budget too.
    llm = make_llm(tiny_dir, max_batch_tokens=budget, mixed_prefill_tokens=None)
    llm.engine.step_records = []
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == [outs[r] for r in rids]
    assert max(s.prefill_tokens for s in llm.engine.step_records if s.decode_rows) > cap


def test_step_log_counts_what_each_step_attends_over(tiny_dir):
    """bench-trace --step-log: each step's decode rows' context and its prefill rows' query-key pairs, so a step-time
    law (benchmarks/schedule_sim.py) can tell a chunk after a long prefix from one after none. A 10-token prompt in
    chunks of 4, then decoding."""
    llm = make_llm(tiny_dir, max_batch_tokens=4, radix_cache=False)
    llm.engine.step_records = []
    llm.generate([list(range(10))], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    got = [
        (s.prefill_tokens, s.prefill_key_pairs, s.decode_rows, s.decode_context_tokens) for s in llm.engine.step_records
    ]
    # chunks [0, 4), [4, 8), [8, 10): 4 x 0 + 10, 4 x 4 + 10, 2 x 8 + 3 pairs; then tokens 11-13 each read their context
    assert got == [(4, 10, 0, 0), (4, 26, 0, 0), (2, 19, 0, 0), (0, 0, 1, 11), (0, 0, 1, 12), (0, 0, 1, 13)]
    assert all(s.context_tokens >= s.decode_context_tokens for s in llm.engine.step_records)


@pytest.mark.skipif(not hasattr(resource, "RUSAGE_THREAD"), reason="per-thread context switches: Linux only")
def test_step_log_counts_the_waits_of_the_stepping_thread(tiny_dir):
    """The step log's context switches are the stepping thread's since the previous record, so a step after the thread
    blocked (in serving, an idle wait for work; here a sleep before every step) counts at least one voluntary switch.
    Its CPU time in the launch is its own: never above the launch's wall time."""
    llm = make_llm(tiny_dir)
    llm.engine.step_records = []
    llm.add_request(list(range(10)), SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    while llm.has_work():
        time.sleep(0.01)
        llm.step()
    steps = llm.engine.step_records
    assert len(steps) >= 6
    assert all(s.voluntary_switches >= 1 for s in steps), [s.voluntary_switches for s in steps]
    assert all(s.involuntary_switches >= 0 and 0 <= s.launch_cpu_ms <= s.launch_ms + 1 for s in steps)


@pytest.mark.parametrize("mixed", [True, False])
def test_running_token_cap_bounds_what_a_decode_step_reads(tiny_dir, mixed):
    """--max-running-tokens: no request is admitted while the running requests' contexts would pass the cap (one
    request alone always runs), so fewer requests decode at a time; the tokens are the same."""
    prompts = prompts_with_shared_prefix()
    base, _ = run(tiny_dir, prompts, mixed_batch=mixed)
    cap = 120
    llm = make_llm(tiny_dir, mixed_batch=mixed, max_running_tokens=cap)
    rids = [llm.add_request(p, GREEDY) for p in prompts]
    outs: dict = {}
    most_live = 0
    while llm.has_work():
        s = llm.engine.scheduler
        before = {id(r): r.num_tokens for r in s.live}
        for o in llm.step():
            outs[o.rid] = o.token_ids
        admitted = [r for r in s.live if id(r) not in before]
        if admitted and before:  # what was live then, plus each newcomer as admitted (its prompt: not decoded yet)
            assert sum(before.values()) + sum(len(r.prompt_ids) for r in admitted) <= cap
        most_live = max(most_live, len(s.live))
    assert 1 < most_live < len(prompts)
    assert [outs[r] for r in rids] == base
    assert_all_pages_back(llm)


def test_sequential_runs_hit_the_radix_cache(tiny_dir):
    llm = make_llm(tiny_dir, page_size=4)
    prompts = prompts_with_shared_prefix()
    first = llm.generate(prompts, GREEDY)
    again = llm.generate(prompts, GREEDY)  # whole prompts are now cached (all but the last partial page)
    assert [o.token_ids for o in again] == [o.token_ids for o in first]
    for o in again:
        assert o.cache_hit_tokens == (len(o.prompt_token_ids) - 1) // 4 * 4 > 0
    assert llm.metrics().cache_hit_tokens >= sum(o.cache_hit_tokens for o in again)
    assert_all_pages_back(llm)


def test_shared_prefix_within_one_batch_hits_after_first_finishes(tiny_dir):
    llm = make_llm(tiny_dir, page_size=4, max_running_requests=1)  # one at a time: later ones find the prefix
    p = prompts_with_shared_prefix(4)
    outs = llm.generate([p[0], p[2]], GREEDY)
    assert outs[0].cache_hit_tokens == 0
    assert outs[1].cache_hit_tokens == 40  # the shared 40-token system prefix, page aligned
    assert_all_pages_back(llm)


def test_a_request_the_step_cannot_feed_waits_and_then_reuses_the_whole_shared_prefix(tiny_dir):
    """Two prompts sharing a 96-token prefix arrive together, the step budget 16 tokens. The second was admitted
    (its prefix looked up, pages and a slot taken) one step into the first's chunked prefill, while the step had no
    budget for it: it matched the 16 tokens computed so far and recomputed the rest. It now waits until a step has
    room, and reuses every whole page the first computed; the outputs are those of each prompt alone."""
    shared = [1 + i % 50 for i in range(96)]
    prompts = [shared + [400, 401, 402], shared + [410, 411, 412]]
    want = [make_llm(tiny_dir, page_size=4).generate([p], GREEDY)[0].token_ids for p in prompts]
    llm = make_llm(tiny_dir, page_size=4, max_batch_tokens=16)
    rids = [llm.add_request(p, GREEDY) for p in prompts]
    llm.step()
    assert llm.metrics().running == 1  # the second waits: this step's 16 tokens went to the first
    outs: dict = {}
    while llm.has_work():
        outs.update((o.rid, o) for o in llm.step() if o.finished)
    assert [outs[r].token_ids for r in rids] == want
    assert (outs[rids[0]].cache_hit_tokens, outs[rids[1]].cache_hit_tokens) == (0, 96)
    assert_all_pages_back(llm)


def test_next_turn_hits_the_prompt_of_a_request_still_running(tiny_dir):
    """A request's prompt KV goes into the radix tree when its prefill is done, not when it finishes: a
    conversation's next turn (or any request sharing the prompt) that arrives meanwhile reuses it."""
    llm = make_llm(tiny_dir, page_size=4)
    first = prompts_with_shared_prefix(1)[0]
    nxt = first + [5, 6, 7, 8, 9, 10]
    alone = make_llm(tiny_dir, page_size=4).generate([nxt], GREEDY)[0].token_ids
    rid = llm.add_request(first, GREEDY)
    for _ in range(3):  # prefill, then two decode steps: `first` is running, far from done
        llm.step()
    assert rid in llm.engine.reqs
    second = llm.add_request(nxt, GREEDY)
    outs: dict = {}
    while len(outs) < 2:
        for o in llm.step():
            if o.finished:
                outs[o.rid] = o
    assert outs[second].cache_hit_tokens == len(first) // 4 * 4  # every whole page of the running prompt
    assert outs[second].token_ids == alone  # and the reused KV gives the same tokens
    assert_all_pages_back(llm)


def test_twin_requests_share_pages_once_both_are_prefilled(tiny_dir):
    """Identical prompts prefilled in the same batch each compute their KV; when they publish it the tree keeps
    one copy and the second request's duplicate pages go back to the free list at once."""
    llm = make_llm(tiny_dir, page_size=4)
    p = prompts_with_shared_prefix(1)[0]
    rids = [llm.add_request(p, GREEDY) for _ in range(3)]
    llm.step()  # one prefill batch for all three
    partial = int(len(p) % 4 > 0)  # each request's own, partly filled last page
    # and each one's run of pages for its first decode steps (kvcache.manager.RUN_PAGES), its own
    ahead = min(RUN_PAGES - 1, -(-(len(p) + GREEDY.max_tokens - 1) // 4) - -(-len(p) // 4))
    assert llm.metrics().kv_pages_in_use == len(p) // 4 + 3 * (partial + ahead)  # one copy of the whole pages
    outs = {}
    while len(outs) < 3:
        outs.update({o.rid: o for o in llm.step() if o.finished})
    assert [outs[r].token_ids for r in rids] == [run(tiny_dir, [p], page_size=4)[0][0]] * 3
    assert_all_pages_back(llm)
    whole = (len(p) + GREEDY.max_tokens - 1) // 4  # whole pages of KV of one sequence (the last token has none)
    assert llm.metrics().kv_pages_cached == whole  # one copy, not three


def test_no_radix_cache_reports_no_hits(tiny_dir):
    llm = make_llm(tiny_dir, radix_cache=False)
    prompts = prompts_with_shared_prefix()
    llm.generate(prompts, GREEDY)
    outs = llm.generate(prompts, GREEDY)
    assert all(o.cache_hit_tokens == 0 for o in outs)
    assert llm.metrics().kv_pages_cached == 0
    assert_all_pages_back(llm)


def test_preemption_under_a_tiny_pool_keeps_tokens(tiny_dir):
    prompts = prompts_with_shared_prefix(8, seed=3)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    big, _ = run(tiny_dir, prompts, params)
    small, llm = run(tiny_dir, prompts, params, page_size=4, num_pages=40)  # 160 tokens for 8 requests
    assert llm.metrics().preemptions > 0
    assert small == big
    assert_all_pages_back(llm)


def test_request_that_can_never_fit_is_rejected(tiny_dir):
    llm = make_llm(tiny_dir, page_size=4, num_pages=10)
    with pytest.raises(ValueError, match="KV cache capacity"):
        llm.add_request(list(range(30)), SamplingParams(max_tokens=20))
    with pytest.raises(ValueError, match="context length"):
        make_llm(tiny_dir, max_model_len=32).add_request(list(range(30)), SamplingParams(max_tokens=5))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.add_request([1, 2, 100000], SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        llm.add_request([], SamplingParams())
    out = llm.generate([list(range(10))], SamplingParams(max_tokens=5, temperature=0))[0]  # others proceed
    assert len(out.token_ids) == 5


def test_abort_returns_every_page(tiny_dir):
    llm = make_llm(tiny_dir, page_size=4)
    rids = [llm.add_request(p, SamplingParams(max_tokens=200, ignore_eos=True)) for p in prompts_with_shared_prefix()]
    for _ in range(5):
        llm.step()
    assert llm.metrics().kv_pages_in_use > 0
    for rid in rids[::2]:
        llm.abort(rid)
    finished = {}
    while llm.has_work():
        for o in llm.step():
            if o.finished:
                finished[o.rid] = o
            if len(finished) == len(rids[::2]) and all(r in finished for r in rids[::2]):
                for rid in rids[1::2]:
                    llm.abort(rid)
    assert all(finished[r].finish_reason == "abort" for r in rids)
    assert_all_pages_back(llm)


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_dir):
    prompts = prompts_with_shared_prefix(6)
    params = [SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, seed=i) for i in range(6)]
    together, _ = run(tiny_dir, prompts, params)
    alone = [run(tiny_dir, [p], sp)[0][0] for p, sp in zip(prompts[:3], params[:3])]
    assert together[:3] == alone
    other_seed = run(tiny_dir, prompts[:1], SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, seed=99))[0][0]
    assert other_seed != together[0]


def test_seeds_a_power_of_two_apart_draw_their_own_tokens(tiny_dir):
    """A CPU generator keeps 32 bits of its seed, and the fused GPU kernel's key was the seed mod 2^31 - 1: seeds
    2^32 (CPU) or 2^31 - 1 (GPU) apart drew the very same tokens. Both now key on a 64-bit hash of the seed."""
    from engine.request import Req
    from engine.sampler import Sampler

    llm = make_llm(tiny_dir)
    prompt = prompts_with_shared_prefix(1)[0]

    def draw(seed: int) -> list[int]:
        params = SamplingParams(max_tokens=16, temperature=1.0, seed=seed, ignore_eos=True)
        return llm.generate([prompt], params)[0].token_ids

    base = draw(1)
    assert draw(1) == base
    assert draw(1 + 2**32) != base and draw(1 - 2**32) != base
    # the GPU kernel's per-position keys (32 bits), at the same position
    keys = {Sampler._row_seed(Req("r", [0], SamplingParams(temperature=1.0, seed=s))) for s in (1, 2**31, 1 + 2**32)}
    assert len(keys) == 3


def test_top_k_1_and_tiny_top_p_are_greedy(tiny_dir):
    prompts = prompts_with_shared_prefix(4)
    greedy, _ = run(tiny_dir, prompts)
    k1, _ = run(tiny_dir, prompts, SamplingParams(max_tokens=24, temperature=1.5, top_k=1, ignore_eos=True))
    p0, _ = run(tiny_dir, prompts, SamplingParams(max_tokens=24, temperature=1.5, top_p=1e-6, ignore_eos=True))
    assert k1 == greedy == p0


@pytest.mark.parametrize(
    "bad",
    [
        dict(temperature=-1),
        dict(top_p=0),
        dict(top_p=1.5),
        dict(max_tokens=0),
        dict(top_k=-2),
        dict(min_p=2),
        dict(repetition_penalty=0),
        dict(stop=[""]),
    ],
)
def test_bad_sampling_params_are_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_stop_token_ids_and_max_tokens(tiny_dir):
    base, _ = run(tiny_dir, prompts_with_shared_prefix(2))
    stop_tok = base[0][5]
    first = base[0].index(stop_tok)
    tokens, _ = run(
        tiny_dir,
        prompts_with_shared_prefix(2)[:1],
        SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop_token_ids=[stop_tok]),
    )
    assert tokens[0] == base[0][: first + 1]
    llm = make_llm(tiny_dir)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=1, temperature=0))[0]
    assert len(out.token_ids) == 1 and out.finish_reason == "length"


def test_generate_takes_per_prompt_params_in_any_sequence():
    # Any Sequence, not only a list or tuple: a deque was once taken for one SamplingParams and failed in add_request.
    params = collections.deque(SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (2, 5))
    outs = make_llm().generate([[1, 2, 3], [4, 5]], params)
    assert [len(o.token_ids) for o in outs] == [2, 5]


@pytest.mark.parametrize("seeded", [False, True])
def test_torch_sampler_draws_from_the_distribution(seeded):
    """The CPU sampling path (an exponential race over the softmax) against the distribution it samples: 4,000 draws
    at temperature 0.5 of fixed logits, and with top_p 0.8 (the nucleus renormalised); the token of probability 0
    never comes. Binomial standard errors are <= 0.008 here, the bound 0.03."""
    from engine.request import Req
    from engine.sampler import Sampler

    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -float("inf")])
    n = 4000
    for top_p, want in ((1.0, torch.softmax(logits / 0.5, -1)), (0.8, None)):
        if want is None:  # the smallest set of tokens whose mass reaches top_p, renormalised
            p = torch.softmax(logits / 0.5, -1)
            keep = (p.cumsum(0) - p) < top_p
            want = torch.where(keep, p, 0) / p[keep].sum()
        params = [
            SamplingParams(temperature=0.5, top_p=top_p, seed=i if seeded else None, max_tokens=1) for i in range(n)
        ]
        reqs = [Req(f"r{i}", [0], p) for i, p in enumerate(params)]
        tokens = Sampler(5, n, torch.device("cpu")).sample(logits.expand(n, 5).clone(), reqs)
        freq = torch.bincount(tokens, minlength=5).float() / n
        assert freq[4] == 0 and (freq - want).abs().max() < 0.03, (top_p, freq, want)


@pytest.mark.parametrize("top_k, top_p, min_p", [(2, 0.6, 0.0), (3, 0.75, 0.0), (0, 0.7, 0.3), (3, 0.9, 0.45)])
def test_filters_combine_as_transformers_warpers_do(top_k, top_p, min_p):
    """top_p is taken over what top_k (and min_p) left, renormalised, as transformers' warpers and vLLM apply them;
    the three masks were independent, so top_k=2 top_p=0.6 of [.5, .22, .18, .1] drew the second token 30% of the
    time where both references never do. 4,000 draws of the CPU sampler against the warpers' distribution."""
    from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from engine.request import Req
    from engine.sampler import Sampler

    logits = torch.tensor([0.5, 0.22, 0.18, 0.1]).log()
    ref = logits[None].clone()
    for warper in (
        TopKLogitsWarper(top_k) if top_k else None,
        TopPLogitsWarper(top_p),
        MinPLogitsWarper(min_p) if min_p else None,
    ):
        ref = warper(None, ref) if warper is not None else ref
    want = torch.softmax(ref[0], -1)
    n = 4000
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p, max_tokens=1)
    reqs = [Req(f"r{i}", [0], params) for i in range(n)]
    tokens = Sampler(4, n, torch.device("cpu")).sample(logits.expand(n, 4).clone(), reqs)
    freq = torch.bincount(tokens, minlength=4).float() / n
    assert (freq[want == 0] == 0).all() and (freq - want).abs().max() < 0.03, (freq, want)


def test_logit_bias_comes_before_the_penalties():
    """vLLM (and transformers) add logit_bias before the repetition penalty divides a seen token's logit; it was
    added after. A prompt token of logit 2 with bias +3 against an unseen one of 3, repetition_penalty 2: (2+3)/2 =
    2.5 loses (after: 2/2+3 = 4 won)."""
    from engine.request import Req
    from engine.sampler import Sampler

    params = SamplingParams(temperature=0, repetition_penalty=2.0, logit_bias={0: 3.0}, max_tokens=1)
    req = Req("r", [0], params)
    req.slot = 0
    sampler = Sampler(2, 1, torch.device("cpu"))
    sampler.start(req)
    assert sampler.sample(torch.tensor([[2.0, 3.0]]), [req]).tolist() == [1]


def test_final_only_streams_get_the_finished_output_alone():
    import asyncio

    from engine.async_llm import AsyncLLM

    a = AsyncLLM(make_llm(num_pages=256))
    prompts = prompts_with_shared_prefix(4)

    async def both() -> tuple[list, list]:
        loop = asyncio.get_running_loop()
        streams = [a.submit(p, GREEDY, loop=loop, final_only=i % 2 == 1) for i, p in enumerate(prompts)]

        async def drain(s):
            return [o async for o in s]

        got = await asyncio.gather(*(drain(s) for s in streams))
        return got[0::2], got[1::2]

    try:
        streamed, final = asyncio.run(both())
    finally:
        a.shutdown()
    assert all(len(outs) == GREEDY.max_tokens for outs in streamed)  # one output per token (one token a step)
    assert all(len(outs) == 1 and outs[0].finished for outs in final)
    ref, _ = run("dummy:tiny-llama", prompts)
    assert [outs[-1].token_ids for outs in streamed] == ref[0::2]
    assert [outs[0].token_ids for outs in final] == ref[1::2]
    assert all(len(outs[0].token_times) == GREEDY.max_tokens for outs in final)


def test_generate_without_callbacks_builds_only_final_outputs_for_token_id_requests():
    """generate() with neither on_step nor on_output builds no output for a running detokenize=False request (the
    host time it saves is the GPU's at small batches); the final outputs are the ones a per-step caller gets, and
    on_progress's counts add up to the tokens produced. Requests that want text still get theirs every step."""
    prompts = [[1 + i, 2, 3, 4 + i] for i in range(6)]
    ids = [SamplingParams(max_tokens=5 + 3 * i, temperature=0, ignore_eos=True, detokenize=False) for i in range(6)]
    seen = make_llm(num_pages=256).generate(prompts, ids, on_step=lambda outs: None)
    llm = make_llm(num_pages=256)
    built: list[bool] = []
    output = llm._output
    llm._output = lambda r: (built.append(r.finished), output(r))[1]
    progress: list[tuple[int, int]] = []
    lean = llm.generate(prompts, ids, on_progress=lambda n, t: progress.append((n, t)))
    assert built == [True] * 6  # one output per request, when it finished
    assert [o.token_ids for o in lean] == [o.token_ids for o in seen] and all(o.finished for o in lean)
    assert [len(o.token_times) for o in lean] == [5 + 3 * i for i in range(6)]
    assert sum(t for _, t in progress) == sum(5 + 3 * i for i in range(6)) and max(n for n, _ in progress) == 6
    built.clear()
    text = [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)] * 2
    llm.generate(prompts[:2], text)
    assert len(built) == 12 and built.count(True) == 2  # text is followed token by token


def test_generate_returns_its_own_requests_when_another_finishes_first():
    """A request added apart (another caller's) that finishes during generate() is not one of its outputs: it once
    counted towards them, ending the call before its own requests were done."""
    llm = make_llm(num_pages=256)
    other = llm.add_request([9, 8, 7], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (10, 20)]
    outs = llm.generate([[1, 2, 3], [4, 5, 6]], params)
    assert [len(o.token_ids) for o in outs] == [10, 20] and other not in {o.rid for o in outs}
    assert not llm.has_work()


def test_piecewise_graph_sizes_pad_little():
    """The padded token counts prefill/mixed steps replay at (engine/piecewise_graph.py): every step of up to the
    limit has a size, at most twice its tokens below 256 and at most 1.25x above."""
    from engine.piecewise_graph import token_sizes

    for limit in (16, 100, 256, 2048, 3000, 8192):
        sizes = token_sizes(limit)
        assert sizes == sorted(set(sizes)) and sizes[-1] == limit and sizes[0] >= 1
        for t in range(1, limit + 1):
            s = next(x for x in sizes if x >= t)
            assert s <= max(16, 2 * t) if t <= 256 else s <= 1.25 * t, (limit, t, s)


def test_a_stream_whose_consumer_loop_has_closed_takes_outputs_quietly():
    """An engine that shuts down after its caller's event loop closed (bench-trace on Ctrl-C) still tells each open
    stream: with nobody left to read, that is not an error ("Event loop is closed" raised in the engine thread)."""
    import asyncio

    from engine.streams import END, RequestStream

    loop = asyncio.new_event_loop()
    stream = RequestStream("r", [1], loop)
    loop.close()
    stream.put(END)  # no RuntimeError


def test_unseeded_requests_draw_their_noise_keys_from_the_engine_seed():
    """The GPU sampler keys an unseeded request's noise on a random 64-bit number, which came from Python's unseeded
    `random`: two runs of the same unseeded requests on a GPU differed even with the same --seed (on a CPU they come
    from torch's generator, which --seed seeds). The keys now follow the engine's seed."""
    from engine.request import seed_key

    def keys(seed: int) -> list[int]:
        llm = make_llm(seed=seed, num_pages=32)
        reqs = [llm.engine.add_request([1, 2, 3], SamplingParams(max_tokens=1)) for _ in range(3)]
        reqs.append(llm.engine.add_request([1, 2, 3], SamplingParams(max_tokens=1, seed=7)))
        llm.shutdown()
        return [r.noise_key for r in reqs]

    first = keys(5)
    assert keys(5) == first and len(set(first[:3])) == 3
    assert keys(6)[:3] != first[:3]
    assert first[3] == seed_key(7)  # a request's own seed keys its noise as before


def _cpu_draws(logits: torch.Tensor, n: int = 4000, **kw) -> torch.Tensor:
    """The CPU sampler's token frequencies over n rows of the same logits."""
    from engine.request import Req
    from engine.sampler import Sampler

    v = logits.numel()
    params = SamplingParams(max_tokens=1, **kw)
    reqs = [Req(f"r{i}", [0], params) for i in range(n)]
    tokens = Sampler(v, n, torch.device("cpu")).sample(logits.expand(n, v).clone(), reqs)
    return torch.bincount(tokens, minlength=v).float() / n


def test_top_k_keeps_the_tokens_tied_with_the_kth():
    """vLLM (apply_top_k_top_p: `logits_sort < kth value`) and transformers' TopKLogitsWarper keep every token whose
    logit equals the k-th's; the sampler kept exactly k by sort position, so of two tied tokens one was never drawn.
    With bf16 logits ties are everywhere (a tiny model's top 60 held one at most k), top_k=2 of [.4, .3, .3] drew
    token 1 42% of the time and token 2 never, where both references draw each 30%."""
    from transformers.generation.logits_process import TopKLogitsWarper

    logits = torch.tensor([0.4, 0.3, 0.3, 0.0001]).log()
    want = torch.softmax(TopKLogitsWarper(2)(None, logits[None].clone())[0], -1)
    freq = _cpu_draws(logits, temperature=1.0, top_k=2)
    assert freq[3] == 0 and (freq - want).abs().max() < 0.03, (freq, want)
    # a bf16 row tied at the boundary, through temperature: the tie is the logits', kept after scaling
    bf16 = torch.tensor([2.0, 1.5, 1.0, 1.0, 0.5], dtype=torch.bfloat16).float()
    freq = _cpu_draws(bf16, temperature=0.7, top_k=3)
    want = torch.softmax(TopKLogitsWarper(3)(None, (bf16 / 0.7)[None].clone())[0], -1)
    assert freq[4] == 0 and freq[3] > 0.05 and (freq - want).abs().max() < 0.03, (freq, want)


def test_top_p_keeps_the_smallest_set_reaching_it():
    """A token is dropped once the tokens before it already hold top_p of the mass, as vLLM (`cumsum <= 1 - p` over
    the ascending sort) and transformers' TopPLogitsWarper: top_p=0.5 of [.5, .25, .25] keeps the first token alone.
    The sampler kept a token whose predecessors held exactly top_p (`>` where both drop on equality): 32% token 1."""
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = torch.tensor([0.5, 0.25, 0.25]).log()
    assert torch.softmax(logits, -1).tolist() == [0.5, 0.25, 0.25]  # exact: the equality is the case
    want = torch.softmax(TopPLogitsWarper(0.5)(None, logits[None].clone())[0], -1)
    assert want.tolist() == [1.0, 0.0, 0.0]
    assert _cpu_draws(logits, temperature=1.0, top_p=0.5).tolist() == [1.0, 0.0, 0.0]
    # summed from the tail, as vLLM sums: a top_p 1 row (filtered by top_k) keeps every token of 150,000 (summed from
    # the head, the float32 sum near 1 lost the tail: 149,999), and top_p 0.999 keeps what transformers keeps
    from engine.sampler import Sampler

    v = 150_000
    probs = torch.softmax(torch.cat([torch.zeros(1), torch.full((v - 1,), -14.0)]), -1)[None]
    sampler = Sampler(v, 1, torch.device("cpu"))
    for top_p in (1.0, 0.999):
        kept = sampler._filter(probs.log(), probs, [SamplingParams(top_k=v, top_p=top_p)])
        want = int(TopPLogitsWarper(top_p)(None, probs.log()).isfinite().sum())
        assert abs(int((kept > 0).sum()) - want) <= 2 and (top_p < 1 or want == v), (top_p, int((kept > 0).sum()), want)
