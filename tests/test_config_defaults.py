"""config.json fields read as transformers reads them, for every supported architecture: a config.json that leaves a
field out gets the value of the architecture's transformers config class (what the checkpoint's authors ran), and
the model transformers builds from the same file (on the meta device: shapes, no weights) is the model the engine
describes. Expectations come from transformers itself, not from a table of defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model_config import HF_MODEL_TYPES, ModelConfig
from engine.sampling_params import SamplingParams
from tests.conftest import make_llm
from tests.hf_reference import hf_greedy, randomize

# What the engine requires: the fields that size the model (a default would describe transformers' example model,
# whose weights a checkpoint does not hold)
REQUIRED = dict(vocab_size=512, hidden_size=256, intermediate_size=96, num_hidden_layers=4, num_attention_heads=64)
REQUIRED_MOE = dict(num_experts=8, moe_intermediate_size=32)
# Every other field the engine reads, each at a value no transformers class takes by default
OPTIONAL: dict[str, Any] = dict(
    num_key_value_heads=16,
    head_dim=24,
    rope_theta=5e5,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 500,
    },
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=1000,
    bos_token_id=5,
    eos_token_id=[6, 7],
    hidden_act="swish",
    attention_bias=False,
    mlp_bias=False,
    sliding_window=64,
    use_sliding_window=False,
)
OPTIONAL_MOE = dict(num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3])


def _config(arch: str, optional: bool = True) -> dict[str, Any]:
    moe = arch == "Qwen3MoeForCausalLM"
    d = dict(architectures=[arch], model_type=HF_MODEL_TYPES[arch], **REQUIRED, **(REQUIRED_MOE if moe else {}))
    return d | (dict(OPTIONAL, **(OPTIONAL_MOE if moe else {})) if optional else {})


def _engine_view(c: ModelConfig) -> dict[str, Any]:
    return dict(
        architecture=c.architecture,
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_layers=c.num_layers,
        num_heads=c.num_heads,
        num_kv_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        qkv_bias=c.qkv_bias,
        qk_norm=c.qk_norm,
        activation="silu",  # the only one this decoder computes (any other is refused)
        rope_theta=c.rope_theta,
        rope_scaling=c.rope_scaling,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings,
        max_position_embeddings=c.max_position_embeddings,
        eos_token_ids=c.eos_token_ids,
        bos_token_id=c.bos_token_id,
        sliding_window=c.sliding_window,
        sparse_layers=[i for i in range(c.num_layers) if c.is_moe_layer(i)],
        experts=(c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob)
        if c.num_experts
        else None,
    )


def _transformers_view(path: Path) -> dict[str, Any]:
    """The same fields of the model transformers' Auto classes build from config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.activations import ACT2FN

    c = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(c)
    attn = m.model.layers[0].self_attn
    rope = dict(c.rope_parameters)
    theta = rope.pop("rope_theta")
    eos = c.eos_token_id
    sparse = [i for i, layer in enumerate(m.model.layers) if hasattr(layer.mlp, "experts")]
    gate = m.model.layers[sparse[0]].mlp.gate if sparse else None
    dense = [layer.mlp for layer in m.model.layers if not hasattr(layer.mlp, "experts")]
    # transformers' Mistral windows every layer by config.sliding_window in its forward; the others keep the layer's
    # window on its attention module (Llama's has none)
    window = c.sliding_window if type(m).__name__ == "MistralForCausalLM" else getattr(attn, "sliding_window", None)
    return dict(
        architecture=type(m).__name__,
        vocab_size=m.model.embed_tokens.num_embeddings,
        hidden_size=m.model.embed_tokens.embedding_dim,
        intermediate_size=dense[0].up_proj.out_features if dense else c.intermediate_size,
        num_layers=len(m.model.layers),
        num_heads=attn.q_proj.out_features // attn.head_dim,
        num_kv_heads=attn.k_proj.out_features // attn.head_dim,
        head_dim=attn.head_dim,
        qkv_bias=attn.q_proj.bias is not None,
        qk_norm=hasattr(attn, "q_norm"),
        activation="silu" if type(ACT2FN[c.hidden_act]) is torch.nn.SiLU else c.hidden_act,
        rope_theta=float(theta),
        rope_scaling=None if rope["rope_type"] == "default" else rope,
        rms_norm_eps=m.model.norm.variance_epsilon,
        tie_word_embeddings=m.lm_head.weight is m.model.embed_tokens.weight,
        max_position_embeddings=c.max_position_embeddings,
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
        bos_token_id=c.bos_token_id,
        sliding_window=window,
        sparse_layers=sparse,
        experts=(
            gate.num_experts,
            gate.top_k,
            m.model.layers[sparse[0]].mlp.experts.intermediate_dim,
            gate.norm_topk_prob,
        )
        if gate is not None
        else None,
    )


def _both_views(d: dict[str, Any], tmp_path: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(d))
    return _engine_view(ModelConfig.from_json_file(path / "config.json")), _transformers_view(path)


def _optional_fields(arch: str) -> list[str]:
    return [*OPTIONAL, *(OPTIONAL_MOE if arch == "Qwen3MoeForCausalLM" else {})]


@pytest.mark.parametrize("arch", list(HF_MODEL_TYPES))
def test_each_field_left_out_reads_as_transformers_reads_it(arch, tmp_path):
    """The full config, then that config less each optional field in turn, then with none of them; and without
    `architectures`, where transformers' AutoModelForCausalLM builds model_type's model (as it always does)."""
    full = _config(arch)
    cases = {"full": full, "none": _config(arch, optional=False)}
    cases |= {"no-architectures": {k: v for k, v in full.items() if k != "architectures"}}
    cases |= {f"no-{k}": {f: v for f, v in full.items() if f != k} for k in _optional_fields(arch)}
    for name, d in cases.items():
        ours, theirs = _both_views(d, tmp_path, name)
        assert ours == theirs, f"{arch} {name}: " + ", ".join(
            f"{k} {ours[k]!r} here, {theirs[k]!r} in transformers" for k in ours if ours[k] != theirs[k]
        )


def test_architectures_and_model_type_name_one_model():
    """architectures picks the model (vLLM's rule: the first class listed that the engine runs); without it
    model_type does (transformers' AutoModelForCausalLM, which reads only model_type); where they disagree,
    transformers and vLLM would run different models: refused, naming both fields."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for arch, model_type in HF_MODEL_TYPES.items():
        assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type] == arch  # the pairs are transformers'
        d = _config(arch, optional=False)
        assert ModelConfig.from_hf_dict(d | {"architectures": []}).architecture == arch
        assert ModelConfig.from_hf_dict(d | {"architectures": ["GPT2LMHeadModel", arch]}).architecture == arch
        assert ModelConfig.from_hf_dict({k: v for k, v in d.items() if k != "model_type"}).architecture == arch
        for other in HF_MODEL_TYPES.values():
            if other != model_type:
                says = rf"architectures \['{arch}'\] and model_type '{other}' name different models \(vLLM runs {arch}"
                with pytest.raises(ValueError, match=says + f".* goes with model_type '{model_type}'"):
                    ModelConfig.from_hf_dict(d | {"model_type": other})
        with pytest.raises(ValueError, match="model_type 'gpt2' name different models"):
            ModelConfig.from_hf_dict(d | {"model_type": "gpt2"})
    neither = {k: v for k, v in d.items() if k not in ("architectures", "model_type")}
    with pytest.raises(ValueError, match="names neither architectures nor model_type"):
        ModelConfig.from_hf_dict(neither)
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2', and no architectures"):
        ModelConfig.from_hf_dict(neither | {"model_type": "gpt2"})
    with pytest.raises(ValueError, match=r"unsupported architectures \['GPT2LMHeadModel', 'BertModel'\]"):
        ModelConfig.from_hf_dict(d | {"architectures": ["GPT2LMHeadModel", "BertModel"]})
    with pytest.raises(ValueError, match="architectures must be a list of model class names"):
        ModelConfig.from_hf_dict(d | {"architectures": "LlamaForCausalLM"})


@pytest.mark.parametrize("arch", list(HF_MODEL_TYPES))
def test_a_field_that_sizes_the_model_is_required_by_name(arch, tmp_path):
    """transformers would build its example model's size (Llama-7B's 4096 hidden units) for a field left out; the
    checkpoint's weights would not fit it: refused, naming the field."""
    for field in [*REQUIRED, *(REQUIRED_MOE if arch == "Qwen3MoeForCausalLM" else {})]:
        (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in _config(arch).items() if k != field}))
        with pytest.raises(ValueError, match=f"config.json lacks the field '{field}'"):
            ModelConfig.from_json_file(tmp_path / "config.json")


@pytest.mark.parametrize("arch", list(HF_MODEL_TYPES))
def test_a_default_kv_head_count_the_heads_do_not_divide_into_is_named(arch):
    """12 heads and no num_key_value_heads: transformers' Qwen2 and Qwen3 take 32 KV heads, its Mistral 8 (and build
    a model with 12 // 32 = 0 query heads per KV head); the engine says so, naming the field to set."""
    from transformers import AutoConfig

    d = _config(arch, optional=False) | {"num_attention_heads": 12, "hidden_size": 12 * 16}
    kv = AutoConfig.for_model(d["model_type"], **{k: v for k, v in d.items() if k != "model_type"}).num_key_value_heads
    if 12 % kv:
        says = f"transformers' {d['model_type']} config takes {kv}, which 12 attention heads do not divide into"
        with pytest.raises(ValueError, match=f"config.json names no num_key_value_heads, and {says}"):
            ModelConfig.from_hf_dict(d)
    else:
        assert ModelConfig.from_hf_dict(d).num_kv_heads == kv


# A tiny model per architecture whose config.json gives only what the engine requires, at 32 heads so that every
# default KV head count (Qwen2's and Qwen3's 32) divides them; Qwen3's default head_dim (128, not 64 / 32) sizes it
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=32)


@pytest.mark.parametrize("arch", list(HF_MODEL_TYPES))
def test_logits_of_a_config_leaving_out_every_optional_field_match_transformers(arch, tmp_path):
    """rope_theta, rms_norm_eps, tie_word_embeddings, head_dim and num_key_value_heads change the logits: the engine
    must read them as transformers does when config.json names none (Qwen3's head_dim was hidden_size / heads here,
    128 there: the checkpoint's q_proj did not fit)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = dict(architectures=[arch], model_type=HF_MODEL_TYPES[arch], **TINY)
    if arch == "Qwen3MoeForCausalLM":
        d |= dict(num_experts=8, moe_intermediate_size=16)  # its default top-k is 8
    (tmp_path / "config.json").write_text(json.dumps(d))
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path), dtype=torch.float32)
    hf = randomize(hf.eval(), seed=7)
    hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(d))  # transformers writes every field: back to the few
    llm = make_llm(str(tmp_path), page_size=4, num_pages=32)
    llm.engine.runner.keep_logits = True
    prompt = list(range(3, 40, 3))
    out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    tokens, first = hf_greedy(hf, prompt, 8)
    assert out.token_ids == tokens
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))
    torch.testing.assert_close(llm.engine.runner.last_logits[0], first, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("field, value", [("rms_norm_eps", None), ("rms_norm_eps", "1e-6"), ("rope_theta", "1e6"),
                                          ("rope_theta", True)])  # fmt: skip
def test_a_number_field_of_another_type_is_refused_by_name(field, value, tmp_path):
    """float() read "1e6" as a number and true as 1.0 (transformers' rope and norms fail on them); a null eps was
    float()'s TypeError, naming no field."""
    (tmp_path / "config.json").write_text(json.dumps(_config("LlamaForCausalLM") | {field: value}))
    with pytest.raises(ValueError, match=f"config.json: {field} must be a number \\(got {value!r}\\)"):
        ModelConfig.from_json_file(tmp_path / "config.json")
