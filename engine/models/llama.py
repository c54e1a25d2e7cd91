"""Llama-architecture decoder (SmolLM2, Llama-3.x) and Qwen3 (the same with per-head q/k RMSNorm)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

import torch
from torch import nn

from engine.distributed import TP
from engine.layers import (
    ColumnParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    fused_ops,
    silu_and_mul,
)
from engine.model_config import ModelConfig
from kernels.attention import AttentionBackend


class Narrowable(Protocol):
    """A weight that can be read in part (a rank reads only its shard)."""

    @property
    def shape(self) -> torch.Size | tuple[int, ...]: ...

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor: ...


# On CUDA, q/k norm + rope + the K/V store run as one Triton kernel per layer (5-6 launches otherwise; docs/gpu.md).
FUSED_QKV = True


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        if cfg.num_heads % TP.size or cfg.num_kv_heads % TP.size:
            raise ValueError(
                f"{cfg.num_heads} heads / {cfg.num_kv_heads} KV heads do not divide by tensor-parallel size {TP.size}"
            )
        self.layer_id = layer_id
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads // TP.size, cfg.num_kv_heads // TP.size, cfg.head_dim
        d = cfg.head_dim
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, [cfg.num_heads * d, cfg.num_kv_heads * d, cfg.num_kv_heads * d]
        )
        self.o_proj = RowParallelLinear(cfg.num_heads * d, cfg.hidden_size)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, rope: RotaryEmbedding, attn: AttentionBackend
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.sizes, dim=-1)
        q = q.view(-1, self.heads, self.head_dim)
        k = k.view(-1, self.kv_heads, self.head_dim)
        v = v.view(-1, self.kv_heads, self.head_dim)
        if FUSED_QKV and x.is_cuda and (ops := fused_ops()) is not None:
            qw = self.q_norm.weight if self.q_norm is not None else None
            kw = self.k_norm.weight if self.k_norm is not None else None
            eps = self.q_norm.eps if self.q_norm is not None else 0.0
            pool = attn.pool
            assert attn.out_slots is not None  # set by the batch's plan
            ops.qk_norm_rope_store(
                q, k, v, qw, kw, eps, rope.cos_sin, pos, pool.k[self.layer_id], pool.v[self.layer_id], attn.out_slots
            )
            return self.o_proj(attn.forward(self.layer_id, q, None, None).reshape(-1, self.heads * self.head_dim))
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(pos, q, k)
        o = attn.forward(self.layer_id, q, k, v)
        return self.o_proj(o.reshape(-1, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        pos: torch.Tensor,
        rope: RotaryEmbedding,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm.add_forward(x, residual)
        x = self.self_attn(x, pos, rope, attn)
        x, residual = self.post_attention_layernorm.add_forward(x, residual)
        return self.mlp(x), residual


# HF checkpoint name -> (our module path, index of the packed shard)
_PACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (
            self.embed_tokens if cfg.tie_word_embeddings else VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        )
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        x, residual = self.embed_tokens(ids), None
        for layer in self.layers:
            x, residual = layer(x, residual, pos, self.rope, attn)
        assert residual is not None  # every model has a layer
        x, _ = self.norm.add_forward(x, residual)
        return x

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """In the model's dtype: the fused sampler reads bf16 directly (a float32 copy of [256, 151936] logits
        costs more than the sampling itself); the sampler casts where it needs to."""
        return self.lm_head.logits(h)

    def load_weights(self, weights: Iterable[tuple[str, Narrowable]]) -> None:
        """Load HF-named weights; raises on unknown or missing names so a wrong file is caught early."""
        modules = dict(self.named_modules())
        loaded: set[str] = set()
        for name, w in weights:
            name = name.removeprefix("model.")
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            if name.endswith("rotary_emb.inv_freq"):
                continue
            m = re.match(r"(.*)\.(\w+)\.weight$", name) or re.match(r"()(\w+)\.weight$", name)
            if m is None:
                raise ValueError(f"unexpected weight {name!r} for {self.cfg.architecture}")
            parent, leaf = m.group(1), m.group(2)
            target, index = _PACKED.get(leaf, (leaf, 0))
            path = f"{parent}.{target}" if parent else target
            module = modules.get(path)
            if module is None or not hasattr(module, "load_shard"):
                raise ValueError(f"unexpected weight {name!r} for {self.cfg.architecture}")
            want = module.full_shape(index)
            if tuple(w.shape) != want:  # a larger tensor would otherwise be cut down to size without a word
                raise ValueError(f"weight {name!r} has shape {tuple(w.shape)}, but the config makes it {want}")
            module.load_shard(index, w)
            loaded.add(f"{path}#{index}")
        expected = {
            f"{p}#{i}"
            for p, m in modules.items()
            if hasattr(m, "load_shard")
            for i in range(len(getattr(m, "sizes", [0])))
        }
        if self.cfg.tie_word_embeddings:
            expected = {e for e in expected if not e.startswith("lm_head")}
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} weights, e.g. {missing[:3]}")

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """These weights under Hugging Face names (TP=1), to build a transformers twin of this model."""
        assert TP.size == 1, "hf_state_dict needs the whole model (tensor-parallel size 1)"
        inverse = {(t, i): leaf for leaf, (t, i) in _PACKED.items()}
        out: dict[str, torch.Tensor] = {}
        for path, m in self.named_modules():
            if not hasattr(m, "load_shard") or (path == "lm_head" and self.cfg.tie_word_embeddings):
                continue
            parent, _, leaf = path.rpartition(".")
            prefix = "" if path == "lm_head" else "model."
            w = m.weight.detach()
            sizes = getattr(m, "sizes", None)
            parts = w.split(sizes) if sizes else [w]
            for i, part in enumerate(parts):
                name = inverse.get((leaf, i), leaf) if sizes else leaf
                full = f"{parent}.{name}" if parent else name
                out[f"{prefix}{full}.weight"] = (
                    part[: self.cfg.vocab_size] if "embed" in leaf or leaf == "lm_head" else part
                )
        return out


class Qwen3ForCausalLM(LlamaForCausalLM):
    pass  # ModelConfig.qk_norm switches on the per-head q/k norms
