"""Greedy tokens identical to Hugging Face transformers on the same weights (fp32, CPU)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.model_config import PRESETS
from engine.sampling_params import SamplingParams
from tests.conftest import make_llm
from tests.hf_reference import hf_greedy, hf_model_from_config, save_hf

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Name a famous painter.",
    "Why is the sky blue?",
]


def test_smollm_matches_transformers(smollm, hf_smollm):
    prompts = [smollm.encode([{"role": "user", "content": p}]) for p in PROMPTS]
    outs = smollm.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        ref, _ = hf_greedy(hf_smollm, prompt, 32)
        assert out.token_ids == ref, (smollm.tokenizer.decode(out.token_ids), smollm.tokenizer.decode(ref))
    paris = outs[0].text
    assert "Paris" in paris, paris  # and the weights are the real ones, not merely the same wrong ones


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_tiny_random_matches_transformers(preset, tmp_path):
    hf = hf_model_from_config(PRESETS[preset])
    save_hf(hf, tmp_path / preset)
    llm = make_llm(str(tmp_path / preset), page_size=4, num_pages=256)  # small: the page check is O(pages)
    runner = llm.engine.runner
    # dense fp32 on a CPU: the whole decode forward through the C kernels (the linears up to 16 rows), replayed from
    # the recorded calls after each batch size's first step (engine/cpu_graph.py)
    assert llm.engine.loaded.cpu_ops and runner.backend.cpu_ops and runner.graphs is not None
    runner.keep_logits = True
    rng = random.Random(1)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(5, 40))] for _ in range(6)]
    for prompt in prompts:
        ref, ref_logits = hf_greedy(hf, prompt, 24)
        out = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
        assert out.token_ids == ref
    # Logits too, on a batch: the last request's first-step logits equal HF's within fp32 noise.
    rid = llm.add_request(prompts[0], SamplingParams(max_tokens=1, temperature=0))
    while llm.has_work():
        llm.step()
    _, ref_logits = hf_greedy(hf, prompts[0], 1)
    torch.testing.assert_close(llm.engine.runner.last_logits[0], ref_logits, rtol=1e-4, atol=1e-4)
    assert rid and runner.graphs.replayed > 0 and not runner.graphs.refused, vars(runner.graphs)


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    """Llama-3.x rope scaling (llama3 type) on a tiny config."""
    from dataclasses import replace

    cfg = replace(
        PRESETS["tiny-llama"],
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        rope_theta=500000.0,
    )
    hf = hf_model_from_config(cfg, seed=3)
    save_hf(hf, tmp_path / "l3")
    llm = make_llm(str(tmp_path / "l3"))
    prompt = list(range(10, 110))  # long enough that low-frequency scaling matters
    out = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    assert out.token_ids == hf_greedy(hf, prompt, 16)[0]


def _llama_cpp_freq_factors(theta: float, head_dim: int, s: dict) -> list[float]:
    """What llama.cpp's convert_hf_to_gguf.py writes as rope_freqs.weight for llama3 rope scaling `s`: per
    frequency, 1 (short wavelengths), `factor` (long ones) or the interpolation between. (The script reads
    original_max_position_embeddings from the config's top level, default 8192, which is rope_scaling's value in
    the Llama 3.x configs; here it is rope_scaling's, a tiny model's.)"""
    factor, lo, hi, old = (
        s["factor"],
        s["low_freq_factor"],
        s["high_freq_factor"],
        s["original_max_position_embeddings"],
    )
    out = []
    for freq in (1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))).tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def _llama_cpp_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order (each head's rotate-half pairs interleaved), as convert_hf_to_gguf.py writes it."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_llama_gguf(hf, path: Path, rope_freqs: list[float] | None) -> Path:
    """`hf` (a transformers Llama) as llama.cpp would convert it to a GGUF (F32 weights), with a byte-level
    tokenizer the engine can build; rope_freqs.weight when given."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    c = hf.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(list(bytes_to_unicode().values()) + ["ab", "ba"] + [f"<t{i}>" for i in range(c.vocab_size - 258)])
    # (transformers wants merges; the prompts are token ids.) Two: transformers 5.17 reads a GGUF array of one as its
    # element, and built the tokenizer from the string's characters ("expected tuple of length 2").
    w.add_token_merges(["a b", "b a"])
    gguf_names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    layer_names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for name, t in hf.state_dict().items():
        stem = name.removesuffix(".weight")
        if stem.startswith("model.layers."):
            n, part = stem.removeprefix("model.layers.").split(".", 1)
            out = f"blk.{n}.{layer_names[part]}"
        else:
            out = gguf_names[stem]
        if out.endswith("attn_q"):
            t = _llama_cpp_permute(t, c.num_attention_heads)
        elif out.endswith("attn_k"):
            t = _llama_cpp_permute(t, c.num_key_value_heads)
        w.add_tensor(out + ".weight", t.float().contiguous().numpy())
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.array(rope_freqs, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_rope_freqs_match_transformers_llama3_scaling(tmp_path):
    """A Llama 3.1-style GGUF, written as llama.cpp writes one (q/k rows interleaved, the llama3 rope as the
    per-frequency factors of rope_freqs.weight), gives transformers' logits and greedy tokens for the same model
    with llama3 rope_scaling, also when read back from the weight cache; the same file without rope_freqs does not."""
    from dataclasses import replace

    from engine import weight_cache
    from engine.layers import rope_freq_factors

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 16.0,
        "original_max_position_embeddings": 256,
    }
    cfg = replace(PRESETS["tiny-llama"], rope_scaling=scaling, rope_theta=10000.0)
    factors = _llama_cpp_freq_factors(cfg.rope_theta, cfg.head_dim, scaling)
    # at head_dim 16: 1 for the shortest wavelength, 8 for the four longest, three interpolated between
    assert factors[0] == 1.0 and factors[4:] == [8.0] * 4 and all(1.0 < f < 8.0 for f in factors[1:4]), factors
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    torch.testing.assert_close(rope_freq_factors(inv_freq, scaling), torch.tensor(factors, dtype=torch.float64))
    hf = hf_model_from_config(cfg, seed=5)
    with_freqs = _write_llama_gguf(hf, tmp_path / "l31.gguf", factors)
    without = _write_llama_gguf(hf, tmp_path / "l31-no-rope-freqs.gguf", None)

    rng = random.Random(7)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(120, 200))] for _ in range(3)]  # positions up to 215
    refs = [hf_greedy(hf, p, 16) for p in prompts]

    def run(path: Path) -> tuple[list[list[int]], list[torch.Tensor]]:
        llm = make_llm(str(path), page_size=4, num_pages=256)
        llm.engine.runner.keep_logits = True
        tokens, logits = [], []
        for prompt in prompts:
            out = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
            tokens.append(list(out.token_ids))
            llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))  # the prompt's last logits
            assert (last := llm.engine.runner.last_logits) is not None
            logits.append(last[0].clone())
        return tokens, logits

    assert weight_cache.lookup(with_freqs) is None
    for attempt in ("from the GGUF", "from the weight cache"):
        tokens, logits = run(with_freqs)
        assert weight_cache.lookup(with_freqs) is not None, attempt  # the first load stored it, the second read it
        for (ref_tokens, ref_logits), got_tokens, got_logits in zip(refs, tokens, logits):
            assert got_tokens == ref_tokens, attempt
            torch.testing.assert_close(got_logits, ref_logits, rtol=1e-4, atol=1e-4, msg=attempt)
    plain_tokens, plain_logits = run(without)
    # (with rope_freqs the logits differ from HF's by ~2e-5; without them by ~8-10, and no greedy token agrees)
    assert all((got - ref).abs().max().item() > 1.0 for got, (_, ref) in zip(plain_logits, refs))
    assert all(got != ref for got, (ref, _) in zip(plain_tokens, refs))
    # bench-offline's transformers peer reads the same file with transformers' GGUF reader, which drops rope_freqs:
    # the peer divides its frequencies by them, so it is the model above, not one without the llama3 rope
    from minisgl_cli.hf_peer import load_hf_model

    peer = load_hf_model(str(with_freqs), torch.device("cpu"), torch.float32)
    for prompt, (ref_tokens, ref_logits) in zip(prompts, refs):
        peer_tokens, peer_logits = hf_greedy(peer, prompt, 16)
        assert peer_tokens == ref_tokens
        torch.testing.assert_close(peer_logits, ref_logits, rtol=1e-4, atol=1e-4)
