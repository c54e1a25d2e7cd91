"""Model hyper-parameters, read from a Hugging Face config.json, GGUF metadata, or a named preset."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class _HFDefaults:
    """An architecture's transformers model_type, and what its config class takes for a field that config.json leaves
    out where the classes differ (every class: rope_theta 10000, rms_norm_eps 1e-6, untied, SiLU). An explicit null
    num_key_value_heads or head_dim is derived in every class, as None here is."""

    model_type: str
    max_position_embeddings: int
    num_key_value_heads: int | None = None  # None: num_attention_heads
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    bos_token_id: int | None = None
    eos_token_id: int | None = None


# Supported architectures. All run through one decoder (engine/models/llama.py); the differences are the flags below:
# q/k/v bias (Qwen2), per-head q/k norm (Qwen3), a sliding window (Mistral), mixture-of-experts MLPs (Qwen3-MoE).
# tests/test_config_defaults.py checks each default against the transformers class.
HF_DEFAULTS = {
    "LlamaForCausalLM": _HFDefaults("llama", 2048, bos_token_id=1, eos_token_id=2),
    "Qwen2ForCausalLM": _HFDefaults("qwen2", 32768, num_key_value_heads=32),
    "MistralForCausalLM": _HFDefaults("mistral", 131072, num_key_value_heads=8, bos_token_id=1, eos_token_id=2),
    "Qwen3ForCausalLM": _HFDefaults("qwen3", 32768, num_key_value_heads=32, head_dim=128),
    "Qwen3MoeForCausalLM": _HFDefaults("qwen3_moe", 32768, num_key_value_heads=4),
}
HF_MODEL_TYPES = {arch: d.model_type for arch, d in HF_DEFAULTS.items()}
_QWEN = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str  # the HF class name (see _architecture), the model registry key
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    name: str = ""
    sliding_window: int | None = None  # attend to the last `sliding_window` positions (the query's own included)
    # Mixture of experts (num_experts > 0): a softmax router picks num_experts_per_tok experts per token, each a
    # SiLU-gated MLP of moe_intermediate_size; norm_topk_prob rescales the picked weights to sum to 1. Layer i is
    # sparse unless listed in mlp_only_layers or (i + 1) % decoder_sparse_step != 0: a dense intermediate_size MLP.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} attention heads do not divide into {self.num_kv_heads} KV heads")
        if not self.max_position_embeddings >= 1:
            raise ValueError(f"max_position_embeddings must be >= 1 (got {self.max_position_embeddings})")
        for name in ("rms_norm_eps", "rope_theta"):  # NaN fails these too
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a positive number (got {getattr(self, name)})")
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling, self.head_dim)
        check_token_ids(self.vocab_size, self.eos_token_ids, self.bos_token_id)
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 (got {self.sliding_window})")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                k = self.num_experts_per_tok
                raise ValueError(f"num_experts_per_tok must be in [1, num_experts={self.num_experts}] (got {k})")
            if self.moe_intermediate_size < 1 or self.decoder_sparse_step < 1:
                raise ValueError("moe_intermediate_size and decoder_sparse_step must be >= 1")

    @property
    def qk_norm(self) -> bool:
        return self.architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")

    @property
    def qkv_bias(self) -> bool:
        return self.architecture == "Qwen2ForCausalLM"

    def is_moe_layer(self, layer: int) -> bool:
        return (
            self.num_experts > 0 and layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0
        )

    def check_splits(self, tp: int) -> None:
        """Refuse a tensor-parallel size that does not divide what each rank holds a share of, naming the config
        fields (the layers' own checks said only "output size 1536", not which field or why)."""
        sizes = {"num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads}
        if not all(self.is_moe_layer(i) for i in range(self.num_layers)):
            sizes["intermediate_size"] = self.intermediate_size
        if self.num_experts:
            sizes["moe_intermediate_size"] = self.moe_intermediate_size
        bad = [f"{field} {n}" for field, n in sizes.items() if n % tp]
        if bad:
            raise ValueError(
                f"{' and '.join(bad)} {'does' if len(bad) == 1 else 'do'} not divide by the tensor-parallel size {tp} "
                "(--tp): each rank holds an equal share"
            )

    def attention_params(self) -> int:
        """One layer's parameters outside its MLP: q, k, v, o (their biases, the q/k norms) and the two RMSNorms."""
        h, hd = self.hidden_size, self.head_dim
        qkvo = h * hd * (2 * self.num_heads + 2 * self.num_kv_heads)
        bias = hd * (self.num_heads + 2 * self.num_kv_heads) if self.qkv_bias else 0
        return qkvo + bias + 2 * h + (2 * hd if self.qk_norm else 0)

    def mlp_params(self, experts: float | None = None) -> float:
        """Every layer's MLP parameters; a sparse layer's router and `experts` of its experts (default: all of them:
        roofline.py counts the few a decode step must read)."""
        h = self.hidden_size
        e = self.num_experts if experts is None else experts
        sparse = self.num_experts * h + e * (3 * h * self.moe_intermediate_size)
        return sum(sparse if self.is_moe_layer(i) else 3 * h * self.intermediate_size for i in range(self.num_layers))

    def param_count(self) -> int:
        """Every parameter the model holds: each layer's experts all, the LM head when not tied to the embedding."""
        h = self.hidden_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return int(self.num_layers * self.attention_params() + self.mlp_params() + h + embed)

    def kv_bytes_per_token(self, dtype_bytes: int, tp_size: int = 1) -> int:
        return 2 * self.num_layers * (self.num_kv_heads // tp_size) * self.head_dim * dtype_bytes

    @staticmethod
    def from_hf_dict(d: dict[str, Any], name: str = "") -> ModelConfig:
        arch = _architecture(d)  # before the fields: another architecture names them differently
        _refuse_unsupported(d, arch)
        # transformers' MistralConfig turns the window on (4096) when config.json names none. Its Llama has no
        # window: a sliding_window in a Llama config.json (a "llamafied" Mistral or Phi-3) is not read, by it or here.
        window = d.get("sliding_window", 4096) if arch == "MistralForCausalLM" else None
        layer_types = d.get("layer_types")
        if arch == "MistralForCausalLM" and isinstance(layer_types, list):
            # transformers loads a Mistral config with layer_types as Ministral: the window only on the layers
            # marked sliding_attention
            kinds = set(layer_types)
            if kinds == {"full_attention"}:
                window = None
            elif kinds != {"sliding_attention"}:
                raise ValueError(
                    f"layer_types {sorted(kinds, key=str)} (a window on some layers only) are not supported for {arch}"
                )
        if arch in _QWEN:
            # Qwen configs carry a sliding_window that applies only with use_sliding_window, and then only to the
            # layers from max_window_layers on: per-layer windows, which this engine does not implement.
            if d.get("use_sliding_window"):
                raise ValueError(
                    f"use_sliding_window=true ({arch} with sliding-window layers) is not supported; "
                    "full-attention checkpoints (use_sliding_window=false) are"
                )
            window = None
        heads = _int(d, "num_attention_heads")
        if heads < 1:
            raise ValueError(f"num_attention_heads must be >= 1 (got {heads})")
        hf = HF_DEFAULTS[arch]  # a field config.json leaves out takes its transformers class's value; a null is kept
        kv_heads = d.get("num_key_value_heads", hf.num_key_value_heads)
        if "num_key_value_heads" not in d and kv_heads is not None and heads % kv_heads:
            raise ValueError(
                f"config.json names no num_key_value_heads, and transformers' {hf.model_type} config takes "
                f"{kv_heads}, which {heads} attention heads do not divide into: set num_key_value_heads"
            )
        head_dim = d.get("head_dim", hf.head_dim)
        eos = d.get("eos_token_id", hf.eos_token_id)
        eos_list = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        if not all(_is_int(t) and t >= 0 for t in eos_list):
            raise ValueError(f"eos_token_id must be a token id or a list of them (got {eos!r})")
        bos = d.get("bos_token_id", hf.bos_token_id)
        if bos is not None and not (_is_int(bos) and bos >= 0):
            raise ValueError(f"bos_token_id must be a token id (got {bos!r})")
        # transformers 5's order: rope_scaling (the old name), when given, is the rope parameters, else
        # rope_parameters; the rope_theta they hold wins over a top-level one
        rope_scaling = d.get("rope_scaling") or d.get("rope_parameters")
        untyped = "default" if not d.get("rope_scaling") else None  # rope_parameters naming no type: default
        rope_theta = d.get("rope_theta")
        if isinstance(rope_scaling, dict) and rope_scaling.get("rope_theta") is not None:
            rope_theta = rope_scaling["rope_theta"]
        if rope_scaling is not None and not isinstance(rope_scaling, dict):
            raise ValueError(f"rope_scaling must be an object (got {rope_scaling!r})")
        return ModelConfig(
            architecture=arch,
            vocab_size=_int(d, "vocab_size"),
            hidden_size=_int(d, "hidden_size"),
            intermediate_size=_int(d, "intermediate_size"),
            num_layers=_int(d, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=heads if kv_heads is None else _int({"num_key_value_heads": kv_heads}, "num_key_value_heads"),
            head_dim=_int(d, "hidden_size") // heads if head_dim is None else _int({"head_dim": head_dim}, "head_dim"),
            rope_theta=_number({"rope_theta": 10000.0 if rope_theta is None else rope_theta}, "rope_theta"),
            # {"rope_type": "default"} is no scaling; a dict naming no type is refused (ModelConfig checks it)
            rope_scaling=rope_scaling
            if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type", untyped)) != "default"
            else None,
            rms_norm_eps=_number({"rms_norm_eps": 1e-6} | d, "rms_norm_eps"),
            tie_word_embeddings=_bool(d, "tie_word_embeddings"),
            max_position_embeddings=_int(
                {"max_position_embeddings": hf.max_position_embeddings} | d, "max_position_embeddings"
            ),
            eos_token_ids=tuple(int(t) for t in eos_list),
            bos_token_id=None if bos is None else int(bos),
            name=name,
            sliding_window=None if window is None else _int({"sliding_window": window}, "sliding_window"),
            **(_moe_fields(d) if arch == "Qwen3MoeForCausalLM" else {}),
        )

    @staticmethod
    def from_json_file(path: Path) -> ModelConfig:
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        except UnicodeDecodeError as e:  # a ValueError that named no file
            raise ValueError(f"{path} is not UTF-8 text: {e}") from e
        except RecursionError as e:  # JSON nested thousands deep
            raise ValueError(f"{path} is not valid JSON: nested too deeply") from e
        except OSError as e:  # no permission, a disk error: was a PermissionError traceback
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from e
        if not isinstance(d, dict):
            raise ValueError(f"{path} holds a JSON {type(d).__name__}, not an object")
        try:
            return ModelConfig.from_hf_dict(d, name=path.parent.name)
        except KeyError as e:
            raise ValueError(f"{path} lacks the field {e.args[0]!r}") from e
        except (TypeError, ValueError) as e:  # a wrong value or type, e.g. "num_attention_heads": "four"
            raise ValueError(f"{path}: {e}") from e

    def to_hf_dict(self) -> dict[str, Any]:
        """A transformers config dict for the same model (used to build the reference model in tests)."""
        mt = HF_MODEL_TYPES[self.architecture]
        d: dict[str, Any] = dict(
            architectures=[self.architecture],
            model_type=mt,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
        )
        if self.architecture == "MistralForCausalLM":
            d["sliding_window"] = self.sliding_window
        if self.num_experts:
            d.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
            )
        if self.rope_scaling:
            d["rope_scaling"] = dict(self.rope_scaling)
        # null, not left out: left out, a Llama's would read as transformers' default (1 and 2)
        d["eos_token_id"] = list(self.eos_token_ids) or None
        d["bos_token_id"] = self.bos_token_id
        return d


def check_token_ids(
    vocab_size: int,
    eos: tuple[int, ...],
    bos: int | None,
    eos_field: str = "eos_token_id",
    bos_field: str = "bos_token_id",
    vocab_field: str = "vocab_size",
) -> None:
    """ValueError naming the field when an EOS or BOS id is no token of the vocabulary (ids 0 to vocab_size - 1):
    an EOS the model can never sample never stops a request, and a BOS outside the embedding fails every prompt."""
    for field_name, ids in ((eos_field, eos), (bos_field, () if bos is None else (bos,))):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            shown = f"{list(ids)!r}: {bad[0]}" if len(ids) > 1 else str(bad[0])
            raise ValueError(
                f"{field_name} {shown} is outside the vocabulary ({vocab_field} {vocab_size}: ids 0 to "
                f"{vocab_size - 1})"
            )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(d: dict[str, Any], key: str) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):  # bool("false") is True
        raise ValueError(f"{key} must be true or false (got {v!r})")
    return v


def _number(d: dict[str, Any], key: str) -> float:
    """d[key] as a float: float() took "1e6" and true (transformers' rope and norms fail on them)."""
    v = d[key]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise ValueError(f"{key} must be a number (got {v!r})")


def _int(d: dict[str, Any], key: str) -> int:
    """d[key] as an int: an integral float (64.0) is one; 64.5, true or "64" are not (int() would cut or parse them)."""
    v = d[key]
    if _is_int(v):
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise ValueError(f"{key} must be an integer (got {v!r})")


# Activations this decoder computes (its MLP is SiLU-gated); transformers' ACT2FN maps "swish" to SiLU too.
_ACTIVATIONS = ("silu", "swish")
# freq_factors: what each of the head_dim / 2 rope frequencies is divided by, as a GGUF's rope_freqs.weight gives
# them (llama.cpp's form of llama3 scaling); {"rope_type": "freq_factors", "factors": [...]}
ROPE_TYPES = ("default", "llama3", "freq_factors")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _architecture(d: dict[str, Any]) -> str:
    """The model a config.json names: the first of its `architectures` this engine runs (vLLM's rule), or without
    that list its `model_type`'s (transformers' AutoModelForCausalLM's). Where both are given they must name one
    model: transformers builds model_type's (and takes the defaults of its config class), vLLM architectures'."""
    archs, model_type = d.get("architectures"), d.get("model_type")
    supported = ", ".join(HF_MODEL_TYPES)
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ValueError(f"architectures must be a list of model class names (got {archs!r})")
    if not archs:
        by_type = {t: a for a, t in HF_MODEL_TYPES.items()}
        if model_type is None:
            raise ValueError(f"config.json names neither architectures nor model_type (supported: {supported})")
        if model_type not in by_type:
            raise ValueError(
                f"unsupported model_type {model_type!r}, and no architectures (supported: {', '.join(by_type)})"
            )
        return by_type[model_type]
    ours: list[str] = [a for a in archs if a in HF_MODEL_TYPES]
    if not ours:
        named = f"architecture {archs[0]!r}" if len(archs) == 1 else f"architectures {archs}"
        raise ValueError(f"unsupported {named} (supported: {supported})")
    if model_type is not None and model_type != HF_MODEL_TYPES[ours[0]]:
        raise ValueError(
            f"architectures {archs} and model_type {model_type!r} name different models (vLLM runs {ours[0]}, "
            f"transformers the {model_type!r} model): {ours[0]} goes with model_type {HF_MODEL_TYPES[ours[0]]!r}"
        )
    return ours[0]


def _refuse_unsupported(d: dict[str, Any], arch: str) -> None:
    """Config fields that would change the model's output and that this engine does not implement: refused here,
    not loaded and ignored."""
    quant = d.get("quantization_config") or d.get("compression_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise ValueError(
            f"quantized checkpoints are not supported (quantization_config: quant_method {method!r}); "
            "give an unquantized (bf16 / fp16 / fp32) checkpoint, or a GGUF file"
        )
    act = d.get("hidden_act", d.get("hidden_activation"))
    if act is not None and act not in _ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r} is not supported (supported: silu)")
    if d.get("attention_bias") and arch != "Qwen2ForCausalLM":  # Qwen2's q/k/v bias is implied, not this flag
        raise ValueError(f"attention_bias=true is not supported for {arch}")
    if d.get("mlp_bias"):
        raise ValueError(f"mlp_bias=true is not supported for {arch}")
    layer_types = d.get("layer_types")
    if arch != "MistralForCausalLM" and isinstance(layer_types, list):
        other = sorted({t for t in layer_types if t != "full_attention"}, key=str)
        if other:
            raise ValueError(f"layer_types {other} are not supported for {arch} (only full_attention layers are)")


def _check_rope_scaling(s: dict[str, Any], head_dim: int) -> None:
    kind = s.get("rope_type", s.get("type"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"unsupported rope scaling type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
    if kind == "llama3":
        missing = [k for k in _LLAMA3_KEYS if not isinstance(s.get(k), (int, float)) or isinstance(s.get(k), bool)]
        if missing:
            raise ValueError(f"llama3 rope scaling needs numbers for {', '.join(missing)} (got {s!r})")
    if kind == "freq_factors":
        factors = s.get("factors")
        what = "rope frequency factors (freq_factors; a GGUF's rope_freqs.weight)"
        if not isinstance(factors, list) or len(factors) != head_dim // 2:
            n = len(factors) if isinstance(factors, list) else repr(factors)
            raise ValueError(f"{what}: need head_dim / 2 = {head_dim // 2} of them (got {n})")
        for i, f in enumerate(factors):  # NaN fails the range test too
            if not (isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < math.inf):
                raise ValueError(f"{what} must be finite numbers > 0 (factor {i} is {f!r})")


def _moe_fields(d: dict[str, Any]) -> dict[str, Any]:
    experts = d.get("num_experts", d.get("num_local_experts"))  # transformers 5 saves the latter
    if experts is None:
        raise KeyError("num_experts")
    layers = d.get("mlp_only_layers") or []
    if not isinstance(layers, list):
        raise ValueError(f"mlp_only_layers must be a list of layer indices (got {layers!r})")
    # the same checks as every other field (_int, _bool): int() cut 2.9 to 2 and bool("false") was True
    return dict(
        num_experts=_int({"num_experts": experts}, "num_experts"),
        num_experts_per_tok=_int({"num_experts_per_tok": 8} | d, "num_experts_per_tok"),  # Qwen3MoeConfig's default
        moe_intermediate_size=_int(d, "moe_intermediate_size"),
        norm_topk_prob=_bool(d, "norm_topk_prob"),
        decoder_sparse_step=_int(d, "decoder_sparse_step") if "decoder_sparse_step" in d else 1,
        mlp_only_layers=tuple(_int({"mlp_only_layers": i}, "mlp_only_layers") for i in layers),
    )


_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# Real shapes for benchmarks with dummy weights (no download needed).
PRESETS: dict[str, ModelConfig] = {
    "Qwen3-0.6B": ModelConfig(
        "Qwen3ForCausalLM",
        151936,
        1024,
        3072,
        28,
        16,
        8,
        128,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        eos_token_ids=(151645,),
        name="Qwen3-0.6B",
    ),
    "Qwen3-32B": ModelConfig(
        "Qwen3ForCausalLM",
        151936,
        5120,
        25600,
        64,
        64,
        8,
        128,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        eos_token_ids=(151645,),
        name="Qwen3-32B",
    ),
    "Llama-3.1-8B": ModelConfig(
        "LlamaForCausalLM",
        128256,
        4096,
        14336,
        32,
        32,
        8,
        128,
        rope_theta=5e5,
        rope_scaling=_LLAMA3_ROPE,
        max_position_embeddings=131072,
        eos_token_ids=(128001, 128008, 128009),
        bos_token_id=128000,
        name="Llama-3.1-8B",
    ),
    # Published config.json shapes: Qwen/Qwen2.5-7B, mistralai/Mistral-7B-v0.1, Qwen/Qwen3-30B-A3B.
    "Qwen2.5-7B": ModelConfig(
        "Qwen2ForCausalLM",
        152064,
        3584,
        18944,
        28,
        28,
        4,
        128,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=131072,
        eos_token_ids=(151643,),
        bos_token_id=151643,
        name="Qwen2.5-7B",
    ),
    "Mistral-7B": ModelConfig(
        "MistralForCausalLM",
        32000,
        4096,
        14336,
        32,
        32,
        8,
        128,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=32768,
        eos_token_ids=(2,),
        bos_token_id=1,
        name="Mistral-7B",
        sliding_window=4096,
    ),
    "Qwen3-30B-A3B": ModelConfig(
        "Qwen3MoeForCausalLM",
        151936,
        2048,
        6144,
        48,
        32,
        4,
        128,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        eos_token_ids=(151645,),
        bos_token_id=151643,
        name="Qwen3-30B-A3B",
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
    ),
    "SmolLM2-135M": ModelConfig(
        "LlamaForCausalLM",
        49152,
        576,
        1536,
        30,
        9,
        3,
        64,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        eos_token_ids=(2,),
        bos_token_id=1,
        name="SmolLM2-135M",
    ),
    # Tiny configs for fast unit tests.
    "tiny-llama": ModelConfig(
        "LlamaForCausalLM",
        512,
        64,
        128,
        2,
        4,
        2,
        16,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        name="tiny-llama",
    ),
    "tiny-qwen3": ModelConfig(
        "Qwen3ForCausalLM",
        512,
        64,
        128,
        2,
        4,
        2,
        16,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
        name="tiny-qwen3",
    ),
    "tiny-qwen3-moe": ModelConfig(
        "Qwen3MoeForCausalLM",
        512,
        64,
        96,
        2,
        4,
        2,
        16,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=2048,
        name="tiny-qwen3-moe",
        num_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=(1,),
    ),
}
