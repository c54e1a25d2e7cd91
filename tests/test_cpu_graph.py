"""Decode steps replayed from recorded C calls (engine/cpu_graph.py, kernels/cpu_ops.Tape) against the same steps run
from Python: the embedded model's tokens and log-probabilities, batch sizes changing as requests finish, the KV slot
lists outgrowing their buffers; and the check that refuses to record a forward that computes in torch."""

from __future__ import annotations

import torch

from engine.cache_paths import cache_root
from engine.cpu_graph import CpuDecodeGraphs, OnlyCCalls
from engine.sampling_params import SamplingParams
from kernels import cpu_ops
from kernels.cpu_ops import QuantMatrix


def test_a_replayed_tape_reads_what_its_inputs_hold_now():
    assert cpu_ops.load(cache_root() / "kernels") is None
    g = torch.Generator().manual_seed(0)
    w = QuantMatrix.from_tensors(
        "Q8_0",
        "w",
        {"w.qs": torch.randint(-127, 128, (48, 64), dtype=torch.int8, generator=g), "w.d": torch.rand(48, 2)},
    )
    norm_w, x = torch.rand(64, generator=g), torch.randn(2, 64, generator=g)
    ids, table = torch.tensor([3, 0]), torch.randn(5, 64, generator=g)

    def forward() -> torch.Tensor:
        return cpu_ops.matmul(cpu_ops.rmsnorm(cpu_ops.embedding(ids, table), norm_w, 1e-5, residual=x), w)

    with cpu_ops.recording() as tape:
        out = forward()
    assert [c[0] for c in tape.calls] == [
        cpu_ops.TAPE_OPS.index(f) for f in ("embedding_f32", "rmsnorm_f32", "q8_0_matmul")
    ]
    for step in range(3):
        ids.copy_(torch.tensor([step + 1, 4 - step]))
        x_before = x.clone()
        tape.replay()
        x_eager = x_before.clone()
        want = cpu_ops.matmul(cpu_ops.rmsnorm(cpu_ops.embedding(ids, table), norm_w, 1e-5, residual=x_eager), w)
        assert torch.equal(out, want) and torch.equal(x, x_eager)  # the same calls: bit for bit, residual included


def test_a_torch_computation_in_a_recording_is_named():
    x, one = torch.randn(4, 6), torch.tensor([1])
    with OnlyCCalls() as guard:
        x.view(2, 12).split([5, 7], dim=-1)
        torch.empty(3)
        x.reshape(24).contiguous()
        assert x.shape == (4, 6) and x.is_contiguous() and x.data_ptr()
    assert guard.foreign is None
    computations = {
        "reshape": lambda: x.t().reshape(24),  # not a view of x's layout: a copy
        "add": lambda: x.view(-1) + 1,
        "add_": lambda: x.view(-1).add_(1),  # in place: its result is a view of x, yet it computes
        "item": lambda: x[0, 0].item(),  # a value read into Python: a replay would keep the branch taken
        "embedding": lambda: torch.nn.functional.embedding(one, x),
        "tensor": lambda: torch.tensor([1]),  # a constant made in the forward
    }
    for name, compute in computations.items():
        with OnlyCCalls() as guard:
            compute()
        assert guard.foreign is not None and name in guard.foreign, (name, guard.foreign)


def _generate(llm, prompts, params):
    llm.engine.clear_cache()  # each run prefills its whole prompt (a cached prefix would change the prefill's rows)
    return [
        (o.token_ids, [(t.token, t.logprob, t.top) for t in o.logprobs or []]) for o in llm.generate(prompts, params)
    ]


def test_replayed_steps_give_the_eager_tokens_and_logprobs(smollm):
    runner = smollm.engine.runner
    graphs = runner.graphs
    assert isinstance(graphs, CpuDecodeGraphs)
    graphs.release()
    graphs.rows = graphs.capacity = 0
    graphs._fit(1, 64)  # buffers outgrown within the run: 4 rows, then more than 64 KV slots
    prompts = [
        [{"role": "user", "content": p}]
        for p in ("Name three rivers.", "What is 2+2?", "Write a haiku about the sea.", "Hello")
    ]
    # different lengths: the batch shrinks from 4 rows to 1 as requests finish, past a page (16) and 64 KV slots
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=3) for n in (40, 9, 25, 17)]
    replayed = _generate(smollm, prompts, params)
    # sizes 4, 3, 2, 1 recorded, and again those after the buffers grew; every other decode step replayed
    assert graphs.recorded >= 5 and graphs.replayed > 30 and not graphs.refused
    assert graphs.rows == 4 and graphs.capacity > 64 and graphs.idx.shape == (4, graphs.capacity)
    try:
        runner.graphs = None
        eager = _generate(smollm, prompts, params)
    finally:
        runner.graphs = graphs
    assert replayed == eager  # bit for bit: the same C calls on the same inputs
    smollm.engine.check()


def test_a_dense_model_replays_its_eager_steps():
    """Dense fp32 weights (no GGUF blocks): the linears through the C dense matmul, the step recorded and replayed, the
    same tokens and log-probabilities as the Python path bit for bit."""
    from tests.conftest import make_llm

    llm = make_llm("dummy:tiny-qwen3", max_running_requests=4)
    try:
        runner = llm.engine.runner
        assert isinstance(runner.graphs, CpuDecodeGraphs)
        assert all(getattr(m, "quant", None) is None for m in runner.model.modules())
        prompts = [[3, 14, 15, 92, 65], [35, 89], [79, 32, 38, 46, 26, 43], [38]]
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=2) for n in (24, 5, 14, 9)]
        replayed = _generate(llm, prompts, params)
        graphs = runner.graphs
        assert graphs.replayed > 10 and not graphs.refused, vars(graphs)
        runner.graphs = None
        assert _generate(llm, prompts, params) == replayed
    finally:
        llm.shutdown()


def test_sampled_replays_match_eager_ones(smollm):
    runner = smollm.engine.runner
    graphs = runner.graphs
    prompts = [[{"role": "user", "content": "Tell me a story."}]] * 3
    params = [SamplingParams(max_tokens=20, temperature=0.8, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    replayed = _generate(smollm, prompts, params)
    try:
        runner.graphs = None
        eager = _generate(smollm, prompts, params)
    finally:
        runner.graphs = graphs
    assert replayed == eager and len({tuple(t) for t, _ in replayed}) == 3


def test_the_switch_turns_recording_off(monkeypatch):
    from tests.conftest import make_llm

    monkeypatch.setenv("MINISGL_CPU_GRAPHS", "0")
    llm = make_llm(None, max_running_requests=4)
    try:
        assert llm.engine.loaded.cpu_ops and llm.engine.runner.graphs is None
    finally:
        llm.shutdown()
