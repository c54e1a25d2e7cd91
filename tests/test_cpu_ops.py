"""The quantized CPU kernel (kernels/cpu_ops.py) against gguf's own dequantization and float64 products, and the
engine's use of it on the embedded model (Q4_1 layers, Q8_0 embedding / LM head)."""

from __future__ import annotations

import subprocess
import sys

import gguf
import pytest
import torch
import torch.nn.functional as F

from engine.cache_paths import cache_root
from engine.layers import CPU_MATMUL_MAX_ROWS, Loadable
from engine.loader import load_model
from engine.model_source import embedded_default_path
from kernels import cpu_ops
from kernels.cpu_ops import QuantMatrix
from tests.conftest import subprocess_env


@pytest.fixture(scope="module")
def gguf_tensors():
    assert cpu_ops.load(cache_root() / "kernels") is None
    reader = gguf.GGUFReader(str(embedded_default_path()))
    picked = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind in ("Q4_1", "Q8_0") and (kind == "Q8_0" or t.name.startswith("blk.3.")):
            ref = torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy()).float()
            picked[t.name] = (QuantMatrix.from_gguf(kind, t.data, *ref.shape), ref)
    assert {q.kind for q, _ in picked.values()} == {"Q4_1", "Q8_0"} and len(picked) == 8
    return picked


def test_blocks_are_the_files_weights(gguf_tensors):
    for name, (q, ref) in gguf_tensors.items():
        assert q.shape == tuple(ref.shape)
        assert torch.equal(q.dequantize(), ref), name  # bit for bit what gguf's reader makes of the file


@pytest.mark.parametrize("rows", [1, 2, 5, CPU_MATMUL_MAX_ROWS, CPU_MATMUL_MAX_ROWS + 3])
def test_matmul_matches_float64(gguf_tensors, rows):
    g = torch.Generator().manual_seed(rows)
    for name, (q, ref) in gguf_tensors.items():
        x = torch.randn(rows, q.shape[1], generator=g)
        y = cpu_ops.matmul(x, q)
        exact = x.double() @ ref.double().T
        err = ((y.double() - exact).abs().max() / exact.abs().max()).item()
        dense = ((F.linear(x, ref).double() - exact).abs().max() / exact.abs().max()).item()
        assert err < 1e-5, (name, err)  # fp32 rounding, as the dense product has it
        assert err < 20 * dense + 1e-6, (name, err, dense)


def test_rows_and_stacking_follow_the_dense_weight(gguf_tensors):
    (q, ref), (k, kref) = gguf_tensors["blk.3.attn_q.weight"], gguf_tensors["blk.3.attn_k.weight"]
    perm = torch.randperm(q.shape[0], generator=torch.Generator().manual_seed(0))
    assert torch.equal(q.rows(perm).dequantize(), ref[perm])
    both = QuantMatrix.cat([q, k])
    assert torch.equal(both.dequantize(), torch.cat([ref, kref]))
    x = torch.randn(3, q.shape[1])
    assert torch.allclose(cpu_ops.matmul(x, both), torch.cat([x @ ref.T, x @ kref.T], dim=1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="cannot stack"):
        QuantMatrix.cat([q, gguf_tensors["blk.3.ffn_down.weight"][0]])
    with pytest.raises(ValueError, match="float32"):
        cpu_ops.matmul(x.double(), q)


def quantized_modules(model: torch.nn.Module) -> dict[str, QuantMatrix]:
    return {n: m.quant for n, m in model.named_modules() if isinstance(m, Loadable) and m.quant is not None}


def test_engine_reads_the_blocks_and_gives_the_dense_logits(smollm):
    model = smollm.engine.runner.model
    quant = quantized_modules(model)
    # every layer's q|k|v, o, gate|up and down, and the (tied) LM head
    assert len(quant) == 4 * model.cfg.num_layers + 1 and "embed_tokens" in quant
    for name, q in quant.items():
        dense = model.get_submodule(name).weight
        assert q.shape == tuple(dense.shape) and torch.equal(q.dequantize(), dense), name
    h = torch.randn(4, model.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with_blocks = model.logits(h)
        for name in quant:
            model.get_submodule(name).quant = None
        try:
            dense = model.logits(h)
        finally:
            for name, q in quant.items():
                model.get_submodule(name).quant = q
    assert torch.allclose(with_blocks, dense, rtol=1e-4, atol=1e-4)


# The two tests below load the embedded model again from the session's weight cache (filled by `smollm`).
def test_no_compiler_keeps_the_dense_weights(smollm, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cpu_ops, "_lib", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    why = cpu_ops.load(tmp_path / "kernels")
    assert why is not None and "C compiler" in why and "no-such-cc" in why
    loaded = load_model(None, torch.device("cpu"), torch.float32, with_tokenizer=False)
    assert quantized_modules(loaded.model) == {}
    assert "no quantized CPU kernel" in capsys.readouterr().err and not loaded.cpu_ops
    dense = load_model("dummy:tiny-llama", torch.device("cpu"), torch.float32, with_tokenizer=False)
    assert not dense.cpu_ops and capsys.readouterr().err == ""  # a dense model loses little: torch's ops, quietly
    monkeypatch.setenv("MINISGL_CPU_OPS", "0")
    assert cpu_ops.load(tmp_path / "kernels") == "turned off by MINISGL_CPU_OPS=0"


def test_a_cache_folder_that_cannot_be_written_keeps_the_kernels(tmp_path):
    """The kernel was built into the cache folder only: a read-only cache, a file in its place or an unwritable HOME
    lost every C kernel (the quantized path: 21 against 85 tok/s), with a message blaming the compiler. It is built
    in a temporary folder then. In a process of its own: a loaded kernel stays loaded."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    script = f"import pathlib; from kernels import cpu_ops; print('why', cpu_ops.load(pathlib.Path({str(blocker)!r})))"
    env = subprocess_env()
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0 and "why None" in p.stdout, p.stdout + p.stderr[-3000:]


def test_bf16_and_other_models_keep_dense_weights(smollm):
    bf16 = load_model(None, torch.device("cpu"), torch.bfloat16, with_tokenizer=False)
    assert quantized_modules(bf16.model) == {} and not bf16.cpu_ops  # the C kernels compute in fp32 only
    tiny = load_model("dummy:tiny-llama", torch.device("cpu"), torch.float32, with_tokenizer=False)
    # dense fp32 weights: torch's linears, the C kernels for the rest (tests/test_hf_equivalence.py runs them)
    assert quantized_modules(tiny.model) == {} and tiny.cpu_ops


# ---- the small fused ops and decode attention, against the eager torch code they replace ------------------------
def test_rmsnorm_with_and_without_residual():
    g = torch.Generator().manual_seed(0)
    for t in (1, 3, 40):  # 40 rows: split over threads
        x, res, w = torch.randn(t, 576, generator=g), torch.randn(t, 576, generator=g), torch.randn(576, generator=g)
        want = F.rms_norm(x, (576,), w, 1e-5)
        assert torch.allclose(cpu_ops.rmsnorm(x, w, 1e-5), want, rtol=1e-5, atol=1e-6)
        r = res.clone()
        out = cpu_ops.rmsnorm(x, w, 1e-5, r)
        assert torch.equal(r, x + res)  # the residual stream, updated in place
        assert torch.allclose(out, F.rms_norm(x + res, (576,), w, 1e-5), rtol=1e-5, atol=1e-6)
        # per-head norms (Qwen3's q and k) over a [T, heads, D] view of a wider qkv row, in place of a copy
        qkv = torch.randn(t, 7 * 64, generator=g)
        q = qkv[:, : 4 * 64].view(t, 4, 64)
        out = cpu_ops.rmsnorm(q, w[:64], 1e-5)
        assert out.shape == (t * 4, 64)
        assert torch.allclose(out.view(t, 4, 64), F.rms_norm(q, (64,), w[:64], 1e-5), rtol=1e-5, atol=1e-6)


def test_rope_on_strided_heads_matches_the_eager_rotation():
    from engine.layers import RotaryEmbedding

    rope = RotaryEmbedding(64, 512, 10000.0, None)
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, (9 + 3 + 3) * 64, generator=g)
    q, k, _ = qkv.split([9 * 64, 3 * 64, 3 * 64], dim=-1)
    q, k = q.view(5, 9, 64), k.view(5, 3, 64)  # views with the row stride of the packed q|k|v, as the model has them
    pos = torch.tensor([0, 1, 7, 300, 511])
    want_q, want_k = rope(pos, q, k)  # eager: new tensors
    cpu_ops.rope_(q, rope.cos_sin, pos)
    cpu_ops.rope_(k, rope.cos_sin, pos)
    assert torch.allclose(q, want_q, rtol=1e-5, atol=1e-6) and torch.allclose(k, want_k, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="packed heads"):
        cpu_ops.rope_(q.transpose(0, 1), rope.cos_sin, pos)


@pytest.mark.parametrize("width", [1536, 1539])  # the vector loop alone, and with the scalar tail
def test_silu_and_mul(width):
    assert cpu_ops.load(cache_root() / "kernels") is None
    x = torch.randn(3, 2 * width, generator=torch.Generator().manual_seed(2)) * 4
    x[0, :8] = torch.tensor([0.0, -0.0, 30.0, -30.0, 100.0, -100.0, 88.0, -90.0])  # sigmoid at 0, 1 and ~e^-100
    gate, up = x.chunk(2, dim=-1)
    exact = F.silu(gate.double()) * up.double()
    out = cpu_ops.silu_and_mul(x)
    assert torch.allclose(out.double(), exact, rtol=2e-6, atol=1e-30)
    assert torch.allclose(out, F.silu(gate) * up, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n,k", [(960, 576), (49152, 64), (100, 37), (7, 3)])  # whole panels, a tail, tail only
def test_dense_matmul_matches_float64_for_every_row_count(n, k):
    g = torch.Generator().manual_seed(n)
    weight = torch.randn(k, n, generator=g).t()  # engine/layers.py's CPU layout: [N, K] stored as [K, N] rows
    assert cpu_ops.dense_transposed(weight) and not cpu_ops.dense_transposed(weight.contiguous())
    bias = torch.randn(n, generator=g)
    wide = torch.randn(16, k + 5, generator=g)
    for m in range(1, 17):  # every tile height of the kernel and their remainders
        x = wide[:m, :k]  # rows with a stride wider than k
        for b in (bias, None):
            exact = x.double() @ weight.double().t() + (0 if b is None else b.double())
            out = cpu_ops.dense_matmul(x, weight, b)
            assert torch.allclose(out.double(), exact, rtol=1e-5, atol=1e-4 * k**0.5), (m, b is None)
            # each row's sum does not depend on the rows beside it: a request's tokens do not depend on its batch
            assert torch.equal(cpu_ops.dense_matmul(x[-1:], weight, b)[0], out[-1])


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("d", [64, 128, 48])  # the kernel's vector paths (4 or 8 vectors a row) and its plain loops
def test_decode_attention_stores_kv_and_attends_like_sdpa(batch, d):
    g = torch.Generator().manual_seed(batch)
    pages, page, kvh, heads = 12, 4, 3, 9
    k_pool, v_pool = torch.randn(pages, page, kvh, d, generator=g), torch.randn(pages, page, kvh, d, generator=g)
    lens = torch.tensor([5, 11, 1, 8][:batch])
    perm = torch.randperm(pages * page, generator=g)
    idx = torch.zeros(batch, int(lens.max()), dtype=torch.int64)
    start = 0
    for b, n in enumerate(lens.tolist()):
        idx[b, :n] = perm[start : start + n]
        start += n
    out_slots = idx[torch.arange(batch), lens - 1].clone()  # each sequence's new token is its last slot
    qkv = torch.randn(batch, (heads + 2 * kvh) * d, generator=g)
    q, k, v = (t.view(batch, -1, d) for t in qkv.split([heads * d, kvh * d, kvh * d], dim=-1))
    kp, vp = k_pool.clone(), v_pool.clone()
    out = cpu_ops.decode_attention(q, k, v, out_slots, kp, vp, idx, lens, d**-0.5)
    want_k, want_v = k_pool.view(-1, kvh, d).clone(), v_pool.view(-1, kvh, d).clone()
    want_k[out_slots], want_v[out_slots] = k, v
    assert torch.equal(kp.view(-1, kvh, d), want_k) and torch.equal(vp.view(-1, kvh, d), want_v)
    for b, n in enumerate(lens.tolist()):
        ks, vs = want_k[idx[b, :n]].transpose(0, 1), want_v[idx[b, :n]].transpose(0, 1)  # [kvh, n, d]
        ref = F.scaled_dot_product_attention(q[b].unsqueeze(1), ks, vs, scale=d**-0.5, enable_gqa=True)
        assert torch.allclose(out[b], ref.squeeze(1), rtol=1e-5, atol=1e-6), b


def test_cpu_ops_give_the_eager_tokens(smollm):
    """The embedded model with every C op on (the default for a GGUF on a CPU) against the same weights with none:
    greedy tokens over the HF test's prompts."""
    from engine.sampling_params import SamplingParams
    from tests.test_hf_equivalence import PROMPTS

    engine = smollm.engine
    model, backend = engine.runner.model, engine.runner.backend
    assert engine.loaded.cpu_ops and backend.cpu_ops
    switched = [m for m in model.modules() if getattr(m, "cpu_ops", False)]
    quant = quantized_modules(model)
    # norms, final norm, rope, MLPs, embedding (tied to the LM head), linear layers (qkv, o, gate_up, down)
    assert len(switched) == 2 * model.cfg.num_layers + 1 + 1 + model.cfg.num_layers + 1 + 4 * model.cfg.num_layers
    sp = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS[:4]]
    fast = [o.token_ids for o in smollm.generate(prompts, sp)]
    graphs = engine.runner.graphs  # its replays call the C ops whatever the modules' flags say
    try:
        engine.runner.graphs = None
        for m in switched:
            m.cpu_ops = False
        for name in quant:
            model.get_submodule(name).quant = None
        backend.cpu_ops = False
        eager = [o.token_ids for o in smollm.generate(prompts, sp)]
    finally:
        for m in switched:
            m.cpu_ops = True
        for name, q in quant.items():
            model.get_submodule(name).quant = q
        backend.cpu_ops = True
        engine.runner.graphs = graphs
    assert fast == eager
