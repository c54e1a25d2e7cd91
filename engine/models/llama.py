"""The one decoder every supported architecture runs: Llama (SmolLM2, Llama-3.x), Qwen2/Qwen2.5 (q/k/v bias), Mistral
(sliding window, applied by the attention backend), Qwen3 (per-head q/k RMSNorm) and Qwen3-MoE (q/k norm, and
mixture-of-experts MLPs in the layers the config makes sparse). The differences are ModelConfig flags."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

from engine.distributed import TP
from engine.layers import (
    ColumnParallelLinear,
    Loadable,
    Narrowable,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    fused_ops,
    silu_and_mul,
)
from engine.model_config import ModelConfig
from engine.models.moe import EXPERT_PROJ, SparseMoE
from kernels.attention import AttentionBackend
from kernels.cpu_ops import QuantMatrix

# On CUDA, q/k norm + rope + the K/V store run as one Triton kernel per layer (5-6 launches otherwise; docs/gpu.md).
FUSED_QKV = True
# On CUDA (with the fused kernels), each layer's RMSNorms are folded into the GEMMs around them (fold_norms): two
# kernels fewer per layer. benchmarks/step_profile.py's `no-fold` variant turns it off.
FOLD_NORMS = True


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads // TP.size, cfg.num_kv_heads // TP.size, cfg.head_dim
        d = cfg.head_dim
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, [cfg.num_heads * d, cfg.num_kv_heads * d, cfg.num_kv_heads * d], bias=cfg.qkv_bias
        )
        self.o_proj = RowParallelLinear(cfg.num_heads * d, cfg.hidden_size)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, rope: RotaryEmbedding, attn: AttentionBackend
    ) -> torch.Tensor:
        return self.o_proj(self.attend(x, pos, rope, attn))

    def attend(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        rope: RotaryEmbedding,
        attn: AttentionBackend,
        folded_norm: RMSNorm | None = None,
    ) -> torch.Tensor:
        """The attention's output before o_proj, [T, heads * head_dim]. `folded_norm`: x is the residual stream
        itself and that norm is folded into qkv_proj (LlamaForCausalLM.fold_norms; the fused kernel scales)."""
        q, k, v = self.qkv_proj(x, with_bias=folded_norm is None).split(self.qkv_proj.sizes, dim=-1)
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
                q,
                k,
                v,
                qw,
                kw,
                eps,
                rope.cos_sin,
                pos,
                pool.k[self.layer_id],
                pool.v[self.layer_id],
                attn.out_slots,
                norm_of=x if folded_norm is not None else None,
                norm_eps=folded_norm.eps if folded_norm is not None else 0.0,
                bias=self.qkv_proj.bias if folded_norm is not None else None,
            )
            o = attn.forward(self.layer_id, q, k, v, stored=True)  # k/v: the kernel's roped K and V, in place
            return o.reshape(-1, self.heads * self.head_dim)
        assert folded_norm is None, "the folded norms need the fused kernel"
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(pos, q, k)
        o = attn.forward(self.layer_id, q, k, v)
        return o.reshape(-1, self.heads * self.head_dim)


class MLP(nn.Module):
    cpu_ops = False  # engine.layers.use_cpu_ops()

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x), self.cpu_ops))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp: MLP | SparseMoE = SparseMoE(cfg) if cfg.is_moe_layer(layer_id) else MLP(cfg)
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

    def forward_folded(self, h: torch.Tensor, pos: torch.Tensor, rope: RotaryEmbedding, attn: AttentionBackend) -> None:
        """The layer on the residual stream h, in place, its norms folded (LlamaForCausalLM.fold_norms): qkv_proj and
        gate_up_proj read h unnormalized, the kernels after them scale by each row's 1/rms, and o_proj and down_proj
        add into h in their GEMMs. The same function as forward() to the dtype's rounding, without a norm kernel."""
        a = self.self_attn
        a.o_proj.add_into(a.attend(h, pos, rope, attn, folded_norm=self.input_layernorm), h)
        if isinstance(self.mlp, MLP):
            ops = fused_ops()
            assert ops is not None  # fold_norms() folds only where the fused kernels are
            up = self.mlp.gate_up_proj(h)
            self.mlp.down_proj.add_into(ops.silu_and_mul(up, h, self.post_attention_layernorm.eps), h)
        else:  # a sparse MLP's router and experts take the normalized rows
            h.add_(self.mlp(self.post_attention_layernorm(h)))


# HF checkpoint name -> (our module path, index of the packed shard)
_PACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_UNPACKED = {v: k for k, v in _PACKED.items()}
_EXPERT = re.compile(r"(.*\.experts)\.(\d+)\.(\w+)_proj\.weight$")  # layers.N.mlp.experts.E.{gate,up,down}_proj
_TENSOR = re.compile(r"(?:(.*)\.)?(\w+)\.(weight|bias)$")


def _locate(name: str) -> tuple[str, str, int] | None:
    """A checkpoint tensor's place here: (module path, param, index), or None for a name of no known shape."""
    if m := _EXPERT.match(name):
        if m.group(3) not in EXPERT_PROJ:
            return None
        return m.group(1), "weight", len(EXPERT_PROJ) * int(m.group(2)) + EXPERT_PROJ.index(m.group(3))
    if m := _TENSOR.match(name):
        parent, leaf, param = m.groups()
        target, index = _PACKED.get(leaf, (leaf, 0))
        return f"{parent}.{target}" if parent else target, param, index
    return None


def _hf_name(path: str, param: str, index: int) -> str:
    if path.endswith(".experts"):
        e, k = divmod(index, len(EXPERT_PROJ))
        return f"{path}.{e}.{EXPERT_PROJ[k]}_proj.weight"
    parent, _, leaf = path.rpartition(".")
    leaf = _UNPACKED.get((leaf, index), leaf)
    return f"{parent}.{leaf}.{param}" if parent else f"{leaf}.{param}"


def _finite(t: torch.Tensor) -> bool:
    """Whether t holds no NaN and no infinity. Its sum is finite unless one of them is there or the sum overflows (only
    then the exact test runs): one read of the tensor, 10x faster than isfinite(t).all() on a CPU (SmolLM2-135M's
    shapes, 161 M fp32 values: 28 vs 299 ms; benchmarks/finite_check_ab.py times the whole load)."""
    return bool(torch.isfinite(t.sum(dtype=torch.float32))) or bool(torch.isfinite(t).all())


def _not_finite(name: str, w: Narrowable, part: torch.Tensor) -> str:
    """The refusal of a checkpoint tensor holding NaN or infinite values as loaded: where it was read, how many, and
    whether the checkpoint holds them or the cast to the model's dtype made them (a value beyond float16's range)."""
    source = getattr(w, "source", None)
    nan, inf = int(part.isnan().sum()), int(part.isinf().sum())
    what = f"{nan:,} NaN and {inf:,} infinite values of {part.numel():,}"
    dtype = str(part.dtype).removeprefix("torch.")
    if bool(torch.isfinite(w.narrow(0, 0, w.shape[0])).all()):  # read again, only to say why
        why = f"once cast to {dtype}: its values are finite but beyond {dtype}'s range (load it in float32 or bfloat16)"
    else:
        why = "(the model would compute NaN logits)"
    return f"weight {name!r}{f' in {source}' if source else ''} holds {what} {why}"


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
        self.folded = False  # fold_norms()

    def fold_norms(self) -> None:
        """On CUDA with the fused kernels (and FOLD_NORMS, FUSED_QKV): each layer's input norm's weight into its
        qkv_proj, its post-attention norm's into gate_up_proj (dense MLPs), so forward() runs forward_folded().
        Decode steps lose two kernels per layer: +1.7% in issue #17's offline run (docs/gpu.md). Not in float16: the
        projections of the unnormalized stream grow by its rms (SmolLM2's gate_up outputs reach ~63,000 folded,
        ~75 not), near float16's 65,504; bfloat16 and float32 have the range."""
        w = self.embed_tokens.weight
        if self.folded or not (FOLD_NORMS and FUSED_QKV and w.is_cuda and w.dtype != torch.float16 and fused_ops()):
            return
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.qkv_proj.fold_norm(layer.input_layernorm.weight)
            if isinstance(layer.mlp, MLP):
                layer.mlp.gate_up_proj.fold_norm(layer.post_attention_layernorm.weight)
        self.folded = True

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        if self.folded:
            h = self.embed_tokens(ids)
            for decoder in cast("list[DecoderLayer]", self.layers):
                decoder.forward_folded(h, pos, self.rope, attn)
            out: torch.Tensor = self.norm(h)
            return out
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

    def loadable(self) -> dict[str, Loadable]:
        """Modules holding checkpoint tensors, by path; the LM head only when it is not the embedding."""
        tied = self.cfg.tie_word_embeddings
        return {p: m for p, m in self.named_modules() if isinstance(m, Loadable) and not (tied and p == "lm_head")}

    def load_weights(self, weights: Iterable[tuple[str, Narrowable]], check_finite: bool = True) -> None:
        """Load HF-named weights; raises on unknown or missing names so a wrong file is caught early, and (with
        check_finite) on the first tensor holding a NaN or an infinity as loaded, which would make every logit NaN
        (checked where it now lies, on the model's device and in its dtype: one pass over each tensor)."""
        modules = self.loadable()
        shards = {p: set(m.shards()) for p, m in modules.items()}
        loaded: set[tuple[str, str, int]] = set()
        emb = self.embed_tokens
        tied_rows = min(emb.per_rank, emb.vocab - emb.start)
        tied_head: torch.Tensor | None = None  # this rank's rows of an lm_head.weight beside tie_word_embeddings=true
        for checkpoint_name, w in weights:
            name = checkpoint_name.removeprefix("model.")
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                # read now (the file may be closed by the end); compared with the embedding once that is loaded
                same_shape = tuple(w.shape) == (emb.vocab, emb.weight.shape[1])
                tied_head = w.narrow(0, emb.start, tied_rows) if same_shape else torch.empty(0)
                continue
            if name.endswith("rotary_emb.inv_freq"):
                continue
            where = _locate(name)
            module = modules.get(where[0]) if where else None
            if where is None or module is None or (where[1], where[2]) not in shards[where[0]]:
                raise ValueError(f"unexpected weight {name!r} for {self.cfg.architecture}")
            _, param, index = where
            want = module.full_shape(param, index)
            if tuple(w.shape) != want:  # a larger tensor would otherwise be cut down to size without a word
                raise ValueError(f"weight {name!r} has shape {tuple(w.shape)}, but the config makes it {want}")
            part = module.load_shard(param, index, w)
            if check_finite and not _finite(part):
                raise ValueError(_not_finite(checkpoint_name, w, part))
            loaded.add(where)
        expected = {(p, param, i) for p, keys in shards.items() for param, i in keys}
        missing = sorted(_hf_name(*k) for k in expected - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} weights, e.g. {missing[:3]}")
        if tied_head is not None:
            # transformers ties only when the two are equal: a different lm_head.weight is the model's LM head
            head = tied_head.to(emb.weight.device, emb.weight.dtype)
            if head.shape != emb.weight[:tied_rows].shape or not torch.equal(head, emb.weight[:tied_rows]):
                raise ValueError(
                    "config.json says tie_word_embeddings=true, but the checkpoint holds an lm_head.weight that "
                    "differs from the embedding (transformers uses it as a separate LM head): set "
                    "tie_word_embeddings to false in config.json"
                )

    def load_quantized(self, quantized: dict[str, QuantMatrix]) -> None:
        """Give linear layers (and the LM head) their GGUF blocks beside the dense weights, for the CPU kernel
        (kernels/cpu_ops.py). A packed layer (q|k|v, gate|up) takes them only when every part has them, stacked
        in its order."""
        modules = self.loadable()
        if self.cfg.tie_word_embeddings:
            modules["lm_head"] = self.embed_tokens
        parts: dict[str, dict[int, QuantMatrix]] = {}
        for name, q in quantized.items():
            name = name.removeprefix("model.")
            where = _locate(name)
            if where is None or where[1] != "weight" or where[0] not in modules:
                continue
            if name == "embed_tokens.weight" and self.cfg.tie_word_embeddings:
                where = ("lm_head", "weight", 0)
            parts.setdefault(where[0], {})[where[2]] = q
        for path, by_index in parts.items():
            module = modules[path]
            if sorted(by_index) != list(range(len({i for _, i in module.shards()}))):
                continue
            q = QuantMatrix.cat([by_index[i] for i in sorted(by_index)])
            # not for a vocabulary padded for tensor parallelism, or a layout this kernel does not read (experts)
            if q.shape == tuple(module.weight.shape):
                module.quant = q

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """These weights under Hugging Face checkpoint names (TP=1), to build a transformers twin of this model."""
        assert TP.size == 1, "hf_state_dict needs the whole model (tensor-parallel size 1)"
        out: dict[str, torch.Tensor] = {}
        for path, m in self.loadable().items():
            for param, i in m.shards():
                prefix = "" if path == "lm_head" else "model."
                out[prefix + _hf_name(path, param, i)] = m.hf_tensor(param, i)
        return out
