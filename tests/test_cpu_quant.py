"""The quantized CPU kernel (kernels/cpu_quant.py) against gguf's own dequantization and float64 products, and the
engine's use of it on the embedded model (Q4_1 layers, Q8_0 embedding / LM head)."""

from __future__ import annotations

import gguf
import pytest
import torch
import torch.nn.functional as F

from engine.cache_paths import cache_root
from engine.engine import load_model
from engine.layers import CPU_QUANT_MAX_ROWS, Loadable
from engine.weights import embedded_default_path
from kernels import cpu_quant
from kernels.cpu_quant import QuantMatrix


@pytest.fixture(scope="module")
def gguf_tensors():
    assert cpu_quant.load(cache_root() / "kernels") is None
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


@pytest.mark.parametrize("rows", [1, 2, 5, CPU_QUANT_MAX_ROWS, CPU_QUANT_MAX_ROWS + 3])
def test_matmul_matches_float64(gguf_tensors, rows):
    g = torch.Generator().manual_seed(rows)
    for name, (q, ref) in gguf_tensors.items():
        x = torch.randn(rows, q.shape[1], generator=g)
        y = cpu_quant.matmul(x, q)
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
    assert torch.allclose(cpu_quant.matmul(x, both), torch.cat([x @ ref.T, x @ kref.T], dim=1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="cannot stack"):
        QuantMatrix.cat([q, gguf_tensors["blk.3.ffn_down.weight"][0]])
    with pytest.raises(ValueError, match="float32"):
        cpu_quant.matmul(x.double(), q)


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
    monkeypatch.setattr(cpu_quant, "_lib", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    why = cpu_quant.load(tmp_path / "kernels")
    assert why is not None and "C compiler" in why and "no-such-cc" in why
    loaded = load_model(None, torch.device("cpu"), torch.float32, with_tokenizer=False)
    assert quantized_modules(loaded.model) == {}
    assert "no quantized CPU kernel" in capsys.readouterr().err
    monkeypatch.setenv("MINISGL_CPU_QUANT", "0")
    assert cpu_quant.load(tmp_path / "kernels") == "turned off by MINISGL_CPU_QUANT=0"


def test_bf16_and_other_models_keep_dense_weights(smollm):
    assert quantized_modules(load_model(None, torch.device("cpu"), torch.bfloat16, with_tokenizer=False).model) == {}
    tiny = load_model("dummy:tiny-llama", torch.device("cpu"), torch.float32, with_tokenizer=False)
    assert quantized_modules(tiny.model) == {}
