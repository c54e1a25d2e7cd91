"""Qwen2, Mistral (sliding window) and Qwen3-MoE: greedy tokens and logits identical to Hugging Face transformers (fp32,
CPU) on tiny random models built with transformers' own classes, saved as HF directories and loaded through the HF
loader (so config.json parsing is checked too, not only the layers)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model_config import PRESETS, ModelConfig
from engine.models.moe import SparseMoE, moe_reference, route
from engine.sampling_params import SamplingParams
from tests.conftest import make_llm
from tests.hf_reference import hf_greedy, randomize, save_hf

TINY: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)
WINDOW = 8  # Mistral's sliding window here: shorter than every prompt below


def _build(name: str):
    import transformers as tf

    if name == "qwen2":  # q/k/v bias, untied LM head (Qwen2.5-7B's layout)
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**dict(TINY, rope_theta=1e6, tie_word_embeddings=False)))
    if name == "qwen2-tied":  # the small Qwen2.5 models tie the LM head to the embedding
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**dict(TINY, rope_theta=1e6, tie_word_embeddings=True)))
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**TINY))
    if name == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**dict(TINY, head_dim=16, sliding_window=WINDOW)))
    if name == "qwen3-moe":  # 3 of 8 experts per token, renormalised; layer 1 dense through mlp_only_layers
        moe = dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=True)
        return tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**dict(TINY, head_dim=16, mlp_only_layers=[1], **moe)))
    raise AssertionError(name)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """One saved HF directory and its transformers model per architecture, built on first use."""
    built: dict[str, tuple[str, object]] = {}

    def get(name: str):
        if name not in built:
            hf = randomize(_build(name).eval(), seed=1)
            built[name] = (str(save_hf(hf, tmp_path_factory.mktemp(name) / name)), hf)
        return built[name]

    return get


def _prompts(n: int, seed: int, lo: int = 10, hi: int = 40, shared: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    head = [rng.randrange(512) for _ in range(shared)]
    return [head + [rng.randrange(512) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("name", ["qwen2", "qwen2-tied", "mistral", "qwen3-moe"])
def test_greedy_tokens_and_logits_match_transformers(name, hf_dirs):
    path, hf = hf_dirs(name)
    llm = make_llm(path, page_size=4, num_pages=128)  # a small pool: the per-step page check is O(pages)
    cfg = llm.engine.model_cfg
    assert (cfg.qkv_bias, cfg.sliding_window, cfg.num_experts) == {
        "qwen2": (True, None, 0),
        "qwen2-tied": (True, None, 0),
        "mistral": (False, WINDOW, 0),
        "qwen3-moe": (False, None, 8),
    }[name]
    prompts = _prompts(4, seed=2)
    outs = llm.generate(prompts, GREEDY)  # one batch: prefill, then decode of 4 rows
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(hf, prompt, GREEDY.max_tokens)[0]
    llm.engine.runner.keep_logits = True
    llm.generate(prompts[:1], SamplingParams(max_tokens=1, temperature=0))
    torch.testing.assert_close(llm.engine.runner.last_logits[0], hf_greedy(hf, prompts[0], 1)[1], rtol=1e-4, atol=1e-4)


def test_sliding_window_with_chunked_prefill_and_prefix_cache(hf_dirs):
    """The window (8) is shorter than the shared prefix (24): prompts prefilled in chunks of 6 tokens, then again
    from the radix cache, attend only to their last 8 positions although the pool keeps every page."""
    path, hf = hf_dirs("mistral")
    llm = make_llm(path, page_size=4, num_pages=128, max_batch_tokens=6)
    prompts = _prompts(3, seed=3, lo=3, hi=12, shared=24)
    refs = [hf_greedy(hf, p, GREEDY.max_tokens)[0] for p in prompts]
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == refs
    again = llm.generate(prompts[1:], GREEDY)
    assert all(o.cache_hit_tokens >= 24 for o in again)
    assert [o.token_ids for o in again] == refs[1:]


@pytest.mark.parametrize("renormalize", [True, False])
def test_moe_block_matches_transformers(renormalize):
    """The router (softmax, top-k, optional renormalisation) and the expert loop against transformers' own block."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    hc = Qwen3MoeConfig(
        hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=4, norm_topk_prob=renormalize
    )
    block = randomize(Qwen3MoeSparseMoeBlock(hc).eval(), seed=4)
    cfg = ModelConfig("Qwen3MoeForCausalLM", 512, 64, 128, 1, 4, 2, 16, num_experts=8, num_experts_per_tok=4,
                      moe_intermediate_size=32, norm_topk_prob=renormalize)  # fmt: skip
    ours = SparseMoE(cfg)
    sd = block.state_dict()
    with torch.no_grad():
        ours.gate.weight.copy_(sd["gate.weight"])
        if "experts.gate_up_proj" in sd:  # transformers 5 keeps the experts stacked, as this engine does
            ours.experts.w13.copy_(sd["experts.gate_up_proj"])
            ours.experts.w2.copy_(sd["experts.down_proj"])
        else:  # transformers 4: one module per expert
            for e in range(8):
                p = f"experts.{e}."
                ours.experts.w13[e].copy_(torch.cat([sd[p + "gate_proj.weight"], sd[p + "up_proj.weight"]]))
                ours.experts.w2[e].copy_(sd[p + "down_proj.weight"])
    x = torch.randn(1, 23, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x[0]), block(x)[0], rtol=1e-5, atol=1e-5)
        weights, ids = route(ours.gate(x[0]), 4, renormalize)
    assert torch.allclose(weights.sum(-1), torch.ones(23)) == renormalize
    assert ids.unique().numel() > 4  # several experts in play, each token with 4 distinct ones
    assert all(len(set(row)) == 4 for row in ids.tolist())
    assert moe_reference(x[0], ours.experts.w13, ours.experts.w2, weights, ids).shape == (23, 64)


def test_unsupported_sliding_window_layouts_are_refused():
    base = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128}
    base |= {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    assert ModelConfig.from_hf_dict(base | {"sliding_window": 4096}).sliding_window is None  # not in use
    with pytest.raises(ValueError, match="use_sliding_window=true .* is not supported"):
        ModelConfig.from_hf_dict(base | {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1})
    with pytest.raises(ValueError, match="attention_bias=true is not supported for MistralForCausalLM"):
        ModelConfig.from_hf_dict(base | {"architectures": ["MistralForCausalLM"], "attention_bias": True})


def _edited(hf_dirs, name: str, tmp_path, **changes) -> str:
    """A copy of the saved `name` directory with config.json's fields changed (None: removed)."""
    import json
    import shutil

    d = tmp_path / f"{name}-edited"
    shutil.copytree(hf_dirs(name)[0], d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        cfg.pop(k, None) if v is None else cfg.__setitem__(k, v)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


@pytest.mark.parametrize(
    "name, changes",
    [
        # transformers takes rope_parameters' theta before a top-level one (one config, two values)
        ("qwen2", dict(rope_theta=1e6, rope_parameters={"rope_type": "default", "rope_theta": 50.0})),
        # transformers loads a Mistral config with layer_types as Ministral: a window only where a layer says so
        ("mistral", dict(layer_types=["full_attention", "full_attention"])),
        ("mistral", dict(layer_types=["sliding_attention", "sliding_attention"])),
    ],
    ids=["rope_theta in two places", "mistral layer_types full", "mistral layer_types sliding"],
)
def test_config_fields_read_as_transformers_reads_them(name, changes, hf_dirs, tmp_path):
    from transformers import AutoModelForCausalLM

    path = _edited(hf_dirs, name, tmp_path, **changes)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = make_llm(path, page_size=4, num_pages=128)
    prompts = _prompts(2, seed=4, lo=20, hi=30)  # longer than the window (8)
    for prompt, out in zip(prompts, llm.generate(prompts, GREEDY)):
        assert out.token_ids == hf_greedy(hf, prompt, GREEDY.max_tokens)[0]


def test_a_sliding_window_in_a_llama_config_is_not_read(hf_dirs, tmp_path):
    """transformers' Llama has no sliding window (nor has vLLM's): a sliding_window in a Llama config.json (a
    "llamafied" Mistral or Phi-3 carries one) leaves every layer attending to the whole context. It was applied here:
    other logits from the first step on. (transformers 5's DynamicCache does read the field, and drops keys from its
    cache that its model's attention mask still attends to, so the reference is the model run on the whole sequence
    at each step, without a cache.)"""
    from transformers import AutoModelForCausalLM

    path = _edited(hf_dirs, "llama", tmp_path, sliding_window=WINDOW)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = make_llm(path, page_size=4, num_pages=128, max_batch_tokens=6)  # chunked prefill, then the prefix cache
    prompts = _prompts(2, seed=4, lo=20, hi=30, shared=12)  # longer than the window (8)
    refs = []
    with torch.no_grad():
        for prompt in prompts:
            seq = list(prompt)
            for _ in range(GREEDY.max_tokens):
                seq.append(int(hf(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
            refs.append(seq[len(prompt) :])
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == refs
    llm.engine.runner.keep_logits = True
    llm.generate(prompts[:1], SamplingParams(max_tokens=1, temperature=0))
    with torch.no_grad():
        ref = hf(torch.tensor([prompts[0]]), use_cache=False).logits[0, -1]
    torch.testing.assert_close(llm.engine.runner.last_logits[0], ref, rtol=1e-4, atol=1e-4)
    assert llm.engine.model_cfg.sliding_window is None


def test_config_fields_transformers_reads_otherwise_are_read_so_or_refused(hf_dirs, tmp_path):
    from transformers import AutoConfig

    # a Mistral config.json without sliding_window: transformers' MistralConfig default, a 4096-token window
    path = _edited(hf_dirs, "mistral", tmp_path, sliding_window=None)
    assert ModelConfig.from_json_file(Path(path) / "config.json").sliding_window == 4096
    assert AutoConfig.from_pretrained(path).sliding_window == 4096
    mixed = ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError, match=r"layer_types \['full_attention', 'sliding_attention'\] .* not supported"):
        make_llm(_edited(hf_dirs, "mistral", tmp_path / "m", layer_types=mixed), num_pages=16)
    linear = {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0}  # beside a top-level rope_theta
    with pytest.raises(ValueError, match="unsupported rope scaling type 'linear'"):
        make_llm(_edited(hf_dirs, "qwen2", tmp_path / "q", rope_theta=1e6, rope_parameters=linear), num_pages=16)


@pytest.mark.parametrize(
    "field, value",
    [
        ("norm_topk_prob", "false"),  # bool("false") was True: the routing weights renormalised
        ("num_experts_per_tok", 2.9),  # int() cut it to 2
        ("moe_intermediate_size", "32"),
        ("decoder_sparse_step", 1.5),
        ("mlp_only_layers", 1),
        ("mlp_only_layers", [0.5]),
    ],
)
def test_moe_fields_of_the_wrong_type_are_refused_by_name(field, value):
    """Every other config field was already checked (an integer, true or false); the MoE ones went through int()."""
    d = PRESETS["tiny-qwen3-moe"].to_hf_dict()
    assert ModelConfig.from_hf_dict(dict(d), "tiny-qwen3-moe") == PRESETS["tiny-qwen3-moe"]
    d[field] = value
    with pytest.raises(ValueError, match=f"{field} must be"):
        ModelConfig.from_hf_dict(d)


def test_transformers_twin_of_a_dummy_moe_model_computes_the_same_logits():
    """hf_state_dict names the stacked experts one by one, and hf_twin stacks them back for transformers 5: the
    twin that the GPU checks and bench-offline --compare build of dummy:<MoE preset> is the same model."""
    from minisgl_cli.hf_peer import hf_twin

    llm = make_llm("dummy:tiny-qwen3-moe", num_pages=64)
    llm.engine.runner.keep_logits = True
    prompt = _prompts(1, seed=5)[0]
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))
    hf = hf_twin(llm.engine.loaded.model, "cpu", torch.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(llm.engine.runner.last_logits[0], ref, rtol=1e-4, atol=1e-5)


def test_every_preset_round_trips_through_a_transformers_config():
    """to_hf_dict -> transformers' own config class -> config.json -> from_hf_dict gives the preset back (what the
    GPU checks' HF twins and the weight cache rely on), the new fields included."""
    from dataclasses import replace

    from transformers import AutoConfig

    from engine.model_config import PRESETS

    for name, cfg in PRESETS.items():
        d = cfg.to_hf_dict()
        saved = AutoConfig.for_model(d.pop("model_type"), **d).to_dict()
        back = ModelConfig.from_hf_dict(saved, name=name)
        rope = {k: v for k, v in (back.rope_scaling or {}).items() if k != "rope_theta"} or None  # transformers 5
        assert replace(back, rope_scaling=rope) == cfg, name


def test_a_norm_folded_into_a_linear_layer_computes_the_projection_of_the_normalized_rows():
    """ColumnParallelLinear.fold_norm, which the CUDA layers use (LlamaForCausalLM.fold_norms), checked in torch:
    x (W diag(g))^T = (x * g) W^T with the bias untouched (with_bias=False leaves it to the fused kernel), and
    hf_tensor unfolds W to the dtype's rounding, a column the norm zeroes coming back zero (it never reaches the
    output)."""
    from engine.layers import ColumnParallelLinear

    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(6, 8, generator=g), torch.randn(6, generator=g), torch.randn(5, 8, generator=g)
    norm = torch.rand(8, generator=g) + 0.5
    norm[3] = 0
    layer = ColumnParallelLinear(8, [4, 2], bias=True)
    with torch.no_grad():
        for i, rows in enumerate((slice(0, 4), slice(4, 6))):
            layer.load_shard("weight", i, w[rows])
            layer.load_shard("bias", i, b[rows])
        expect = layer(x * norm)
        layer.fold_norm(norm)
        torch.testing.assert_close(layer(x), expect)
        torch.testing.assert_close(layer(x, with_bias=False), expect - b)
    back = torch.cat([layer.hf_tensor("weight", 0), layer.hf_tensor("weight", 1)])
    w[:, 3] = 0
    torch.testing.assert_close(back, w)
    assert torch.equal(torch.cat([layer.hf_tensor("bias", 0), layer.hf_tensor("bias", 1)]), b)
