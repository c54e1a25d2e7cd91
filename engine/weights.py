"""Reading model weights: a Hugging Face directory's safetensors, a GGUF file's tensors, dummy weights (which one a
--model value names: engine/model_source.py)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from engine.gguf_file import GGUFFile, read_gguf
from engine.model_config import PRESETS, ModelConfig, check_token_ids
from engine.model_source import resolve
from kernels.cpu_ops import BLOCK_BYTES, QK, QuantMatrix

# ---- Hugging Face directory -------------------------------------------------------------------------
# Weight dtypes read as they are (cast to the model's dtype). Integer, bool and fp8 tensors are quantized or not
# weights at all: casting them would load a broken model without a word.
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
INDEX_FILE = "model.safetensors.index.json"


class _SafetensorSlice:
    """A lazily read safetensors tensor: narrow() reads only the requested rows/columns from disk."""

    def __init__(self, handle: Any, name: str, file: Path):  # a safetensors safe_open handle
        self._slice = handle.get_slice(name)
        self.shape = tuple(self._slice.get_shape())
        self.dtype = str(self._slice.get_dtype())
        self.source = str(file)  # named in the load's errors (engine/layers.py Narrowable)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        part: torch.Tensor = self._slice[tuple(index)]
        return part


def hf_weight_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files: those its index (model.safetensors.index.json) lists, when it has one
    (other .safetensors files beside them, e.g. Mistral's consolidated.safetensors, are not part of it), else all."""
    index = path / INDEX_FILE
    if not index.is_file():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"model directory {path} has no .safetensors files")
        return files
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index} is not a safetensors index (JSON with a weight_map object): {e!r}") from e
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{index}: its weight_map names no files")
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{index} lists {len(missing)} file(s) missing from {path}: {', '.join(missing)}")
    return [path / n for n in names]


def hf_weights(path: Path) -> Iterator[tuple[str, _SafetensorSlice]]:
    from safetensors import safe_open

    seen: dict[str, Path] = {}
    for f in hf_weight_files(path):
        try:
            handle = safe_open(str(f), framework="pt")
        except Exception as e:
            raise ValueError(f"cannot read {f}: {e}") from e
        with handle:
            for name in handle.keys():
                if name in seen:  # the later file's copy would silently replace the earlier one
                    raise ValueError(f"tensor {name!r} is in both {seen[name]} and {f}")
                seen[name] = f
                try:
                    t = _SafetensorSlice(handle, name, f)
                except Exception as e:
                    raise ValueError(f"cannot read tensor {name!r} in {f}: {e}") from e
                if t.dtype not in _FLOAT_DTYPES:
                    raise ValueError(
                        f"tensor {name!r} in {f} has dtype {t.dtype}: quantized or integer weights are not "
                        f"supported (supported: {', '.join(_FLOAT_DTYPES)})"
                    )
                yield name, t


def hf_config(path: Path) -> ModelConfig:
    return ModelConfig.from_json_file(path / "config.json")


def model_config(kind: str, where: str | Path, reader: GGUFFile | None = None) -> ModelConfig:
    """The config of a resolved --model value (engine/model_source.py's kind and path), without its weights."""
    if kind == "dummy":
        return PRESETS[str(where)]
    if kind == "gguf":
        return gguf_config(Path(where), reader)
    return hf_config(Path(where))


def model_config_for(spec: str | None) -> ModelConfig:
    """The ModelConfig of a --model value without loading its weights."""
    return model_config(*resolve(spec))


# ---- GGUF ------------------------------------------------------------------------------------------
_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_GGUF_ARCH = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def open_gguf(path: Path) -> GGUFFile:
    try:
        return read_gguf(path)
    except (ValueError, struct.error, OSError, KeyError, IndexError) as e:
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from e


def _field(reader: GGUFFile, key: str, default: Any = None) -> Any:
    return reader.fields.get(key, default)


def gguf_config(path: Path, reader: GGUFFile | None = None) -> ModelConfig:
    r = reader or open_gguf(path)
    arch = _field(r, "general.architecture")
    if arch not in _GGUF_ARCH:
        raise ValueError(f"{path}: unsupported GGUF architecture {arch!r} (supported: {', '.join(_GGUF_ARCH)})")
    p = f"{arch}."

    def need(key: str) -> int:  # a field the shapes come from: missing, int(None) was a bare TypeError
        v = _field(r, p + key)
        if v is None:
            raise ValueError(f"{path}: GGUF metadata lacks {p + key!r}")
        try:
            if isinstance(v, list):  # a per-layer array (llama.cpp allows one): int() raised a bare TypeError
                raise ValueError("a per-layer array")
            return int(v)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: GGUF metadata {p + key!r} is not an integer ({v!r})") from e

    heads = need("attention.head_count")
    hidden = need("embedding_length")
    kv_heads = need("attention.head_count_kv") if _field(r, p + "attention.head_count_kv") is not None else heads
    if heads < 1:
        raise ValueError(f"{path}: GGUF metadata {p}attention.head_count must be >= 1 (got {heads})")
    names = {t.name for t in r.tensors}
    # What would change the rope and is not implemented here: refused, not ignored.
    scaling = _field(r, p + "rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{path}: GGUF rope scaling {scaling!r} is not supported")
    # llama.cpp applies a scaling factor without a type as linear scaling (its default type); older converters wrote
    # it as rope.scale_linear
    for key in ("rope.scaling.factor", "rope.scale_linear"):
        factor = _field(r, p + key)
        if scaling is None and factor not in (None, 0, 0.0, 1, 1.0):
            raise ValueError(f"{path}: GGUF {p + key} = {factor!r} (linear rope scaling) is not supported")
    vocab = _field(r, p + "vocab_size") or len(_field(r, "tokenizer.ggml.tokens", []))
    if not vocab:
        raise ValueError(f"{path}: GGUF metadata gives no vocabulary size ({p}vocab_size or tokenizer.ggml.tokens)")
    eos = _field(r, "tokenizer.ggml.eos_token_id")
    bos = _field(r, "tokenizer.ggml.bos_token_id")
    head_dim = int(_field(r, p + "attention.key_length", hidden // heads))
    rotary = _field(r, p + "rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        raise ValueError(f"{path}: partial rotary embeddings (rope over {rotary} of {head_dim} dims) are not supported")
    intermediate, layers = need("feed_forward_length"), need("block_count")
    factors = _rope_freq_factors(path, r)
    try:
        eos_ids, bos_id = (() if eos is None else (int(eos),)), (None if bos is None else int(bos))
        # named by their GGUF keys (ModelConfig checks them again, under config.json's names)
        vocab_key = f"{p}vocab_size" if _field(r, p + "vocab_size") else "tokenizer.ggml.tokens (its length)"
        check_token_ids(
            int(vocab), eos_ids, bos_id, "tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id", vocab_key
        )
        return ModelConfig(
            architecture=_GGUF_ARCH[arch],
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=float(_field(r, p + "rope.freq_base", 10000.0)),
            rope_scaling=None if factors is None else {"rope_type": "freq_factors", "factors": factors},
            rms_norm_eps=float(_field(r, p + "attention.layer_norm_rms_epsilon", 1e-6)),
            tie_word_embeddings="output.weight" not in names,
            # required by the GGUF spec and llama.cpp: a guess would let prompts run past the trained window
            max_position_embeddings=need("context_length"),
            eos_token_ids=eos_ids,
            bos_token_id=bos_id,
            name=path.stem,
        )
    except ValueError as e:  # a value ModelConfig refuses (KV heads that do not divide the heads, ...)
        raise ValueError(f"{path}: {e}") from e


def _rope_freq_factors(path: Path, reader: GGUFFile) -> list[float] | None:
    """The llama3 rope of Llama 3.1 and later as llama.cpp stores it: rope_freqs.weight, what each of the
    head_dim / 2 frequencies is divided by (ModelConfig checks their number and values). None: the file has none."""
    import gguf

    t = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if t is None:
        return None
    if t.tensor_type.name not in _FLOAT_DTYPES:  # llama.cpp writes F32; a quantized or integer one is no float
        raise ValueError(f"{path}: rope_freqs.weight has type {t.tensor_type.name}, not F32")
    return [float(f) for f in gguf.dequantize(t.data, t.tensor_type).reshape(-1)]


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp interleaves q/k rows for its rope; HF checkpoints (and this engine) use rotate-half."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_weights(
    path: Path,
    cfg: ModelConfig,
    reader: GGUFFile | None = None,
    progress: Callable[[], None] | None = None,
    quantized: dict[str, QuantMatrix] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantized weights under HF names. Each rank dequantizes whole tensors and keeps its shard. With
    `quantized`, the tensors a CPU kernel reads as stored (Q4_1, Q8_0) are also put there, under the same names."""
    import gguf

    r = reader or open_gguf(path)
    llama_rope = cfg.architecture == "LlamaForCausalLM"
    for t in r.tensors:
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        elif parts[0] == "blk" and parts[2] in _GGUF_NAMES:
            name = f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.weight"
        elif t.name == "rope_freqs.weight":  # no weight: gguf_config reads it into the config's rope scaling
            continue
        else:
            raise ValueError(f"{path}: unexpected GGUF tensor {t.name!r}")
        q = None
        try:
            if t.tensor_type.name in BLOCK_BYTES and len(t.shape) == 2 and t.shape[0] % QK == 0:
                # the blocks as the CPU kernels keep them, dequantized by torch: the same floats as gguf's numpy
                # dequantization gives (tests/test_cpu_ops.py), in a tenth of the time
                q = QuantMatrix.from_gguf(t.tensor_type.name, t.data, t.shape[1], t.shape[0])
                w = q.dequantize()
            else:
                w = torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy()).float()
        except Exception as e:
            raise ValueError(f"{path}: cannot dequantize {t.name} ({t.tensor_type.name}): {e}") from e
        heads = None
        if llama_rope and parts[-2:-1] == ["attn_q"]:
            heads = cfg.num_heads
        elif llama_rope and parts[-2:-1] == ["attn_k"]:
            heads = cfg.num_kv_heads
        if heads is not None:
            w = _unpermute(w, heads)
        w.source = f"{path} (GGUF tensor {t.name})"  # type: ignore[attr-defined]  # named in the load's errors
        if quantized is not None and q is not None:
            quantized[name] = q if heads is None else q.rows(_unpermute(torch.arange(w.shape[0]), heads))
        if progress is not None:
            progress()
        yield name, w


def gguf_tensor_count(path: Path, reader: GGUFFile | None = None) -> int:
    """How many weights gguf_weights yields (its progress ticks)."""
    return sum(t.name != "rope_freqs.weight" for t in (reader or open_gguf(path)).tensors)


# ---- dummy -----------------------------------------------------------------------------------------
def dummy_weights(
    cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype, seed: int = 0
) -> Iterator[tuple[str, torch.Tensor]]:
    """Random weights at real shapes under HF names, each drawn whole from a generator keyed by its name, so
    every tensor-parallel rank (which keeps only its shard) sees the same model as a single GPU does.
    Norm weights are 1 so activations keep a sane scale."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (cfg.num_heads * d, h),
                p + "self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
                p + "self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
                p + "self_attn.o_proj.weight": (h, cfg.num_heads * d),
            }
        )
        if cfg.qkv_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (cfg.num_heads * d,),
                    p + "self_attn.k_proj.bias": (cfg.num_kv_heads * d,),
                    p + "self_attn.v_proj.bias": (cfg.num_kv_heads * d,),
                }
            )
        if cfg.is_moe_layer(n):
            m = cfg.moe_intermediate_size
            shapes[p + "mlp.gate.weight"] = (cfg.num_experts, h)
            for e in range(cfg.num_experts):
                q = f"{p}mlp.experts.{e}."
                shapes.update(
                    {q + "gate_proj.weight": (m, h), q + "up_proj.weight": (m, h), q + "down_proj.weight": (h, m)}
                )
        else:
            shapes.update(
                {
                    p + "mlp.gate_proj.weight": (i, h),
                    p + "mlp.up_proj.weight": (i, h),
                    p + "mlp.down_proj.weight": (h, i),
                }
            )
        # (In this order, which keys each tensor's seed: the dense presets keep the weights they always had.)
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        if cfg.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    g = torch.Generator(device=device)
    for k, (name, shape) in enumerate(shapes.items()):
        if "norm" in name:
            yield name, torch.ones(shape, device=device, dtype=dtype)
            continue
        g.manual_seed(seed * 1_000_003 + k)
        yield name, torch.empty(shape, device=device, dtype=dtype).normal_(0.0, 0.02, generator=g)
