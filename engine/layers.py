"""Building blocks of the models: tensor-parallel linear layers, RMSNorm, rotary embedding; what loads weights."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed import TP
from kernels import cpu_ops
from kernels.cpu_ops import QuantMatrix

# At most this many rows (tokens) go through the CPU kernels' matmuls (kernels/cpu_ops.py); longer prefills use
# torch's on the dense fp32 weights. Measured on the project's AVX2 machine, one pass over SmolLM2's matrices: 16 rows
# 90 ms from the blocks against 170 dense (docs/benchmarks.md).
CPU_MATMUL_MAX_ROWS = 16


def _linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    quant: QuantMatrix | None,
    bias: torch.Tensor | None = None,
    cpu: bool = False,
) -> torch.Tensor:
    """x W^T (+ b), for a small batch through the CPU kernels (`cpu`: a module use_cpu_ops() switched): from the
    quantized blocks where the kernel holds them, else from the dense weight if it has the CPU layout."""
    if quant is not None and x.shape[0] <= CPU_MATMUL_MAX_ROWS:
        y = cpu_ops.matmul(x, quant)
        return y if bias is None else y + bias
    if cpu and x.dim() == 2 and x.shape[0] <= CPU_MATMUL_MAX_ROWS and cpu_ops.dense_transposed(weight):
        return cpu_ops.dense_matmul(x, weight, bias)
    return F.linear(x, weight, bias)


class FusedOps(Protocol):
    """What the engine calls in kernels/triton_ops.py (that module satisfies this protocol)."""

    def rmsnorm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor: ...
    def rope_inplace(self, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor, pos: torch.Tensor) -> None: ...
    def silu_and_mul(self, x: torch.Tensor, norm_of: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor: ...
    def sample_gumbel(self, logits: torch.Tensor, temps: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor: ...
    def qk_norm_rope_store(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_weight: torch.Tensor | None,
        k_weight: torch.Tensor | None,
        eps: float,
        cos_sin: torch.Tensor,
        pos: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        norm_of: torch.Tensor | None = None,
        norm_eps: float = 0.0,
        bias: torch.Tensor | None = None,
    ) -> None: ...


@functools.cache
def fused_ops() -> FusedOps | None:
    """The Triton kernels (kernels/triton_ops.py) when a CUDA device and Triton are there, else None."""
    if not torch.cuda.is_available():
        return None
    try:
        from kernels import triton_ops
    except ImportError:
        return None
    return triton_ops


class Narrowable(Protocol):
    """A checkpoint tensor that can be read in part (a rank reads only its shard). A `source` attribute, where the
    stream gives one, says where it was read (a file, a GGUF tensor) for the load's error messages."""

    @property
    def shape(self) -> torch.Size | tuple[int, ...]: ...

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor: ...


class Loadable(nn.Module):
    """A module holding checkpoint tensors. Each is addressed by (param, index): `index` picks one logical tensor of
    several packed into one parameter (q|k|v in qkv_proj, the experts of a MoE layer), `param` is weight or bias.
    A linear layer may also hold its weight as GGUF blocks (`quant`, engine.models.llama.load_quantized)."""

    weight: nn.Parameter
    quant: QuantMatrix | None = None

    def shards(self) -> list[tuple[str, int]]:
        return [("weight", 0)]

    def full_shape(self, param: str, index: int) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    def load_shard(self, param: str, index: int, full: Narrowable) -> torch.Tensor:
        """Copy this rank's part of the checkpoint tensor in; the part of the parameter it now fills."""
        return self.weight.copy_(full.narrow(0, 0, full.shape[0]))

    def hf_tensor(self, param: str, index: int) -> torch.Tensor:
        """The whole checkpoint tensor (tensor-parallel size 1), to build a transformers twin."""
        return self.weight.detach()


class ColumnParallelLinear(Loadable):
    """y = x W^T (+ b) with W's output rows split over ranks. `sizes` packs several logical outputs (q|k|v)."""

    cpu_ops = False  # use_cpu_ops(), on one process

    def __init__(self, in_features: int, sizes: list[int], bias: bool = False):
        super().__init__()
        for s in sizes:
            if s % TP.size:
                raise ValueError(f"output size {s} does not divide by tensor-parallel size {TP.size}")
        self.sizes = [s // TP.size for s in sizes]
        self.weight = nn.Parameter(torch.empty(sum(self.sizes), in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(sum(self.sizes)), requires_grad=False) if bias else None
        self.folded_norm: torch.Tensor | None = None  # fold_norm()'s weight

    def fold_norm(self, norm_weight: torch.Tensor) -> None:
        """Take the weight of the RMSNorm before this layer into W's columns: (n * g) W^T = n (W diag(g))^T, so the
        layer can read the norm's input unscaled and the kernel after it applies each row's 1/rms (DecoderLayer)."""
        self.weight.copy_(self.weight.float() * norm_weight.float())
        self.folded_norm = norm_weight

    def shards(self) -> list[tuple[str, int]]:
        params = ["weight", "bias"] if self.bias is not None else ["weight"]
        return [(p, i) for p in params for i in range(len(self.sizes))]

    def full_shape(self, param: str, index: int) -> tuple[int, ...]:
        n = self.sizes[index] * TP.size
        return (n, self.weight.shape[1]) if param == "weight" else (n,)

    def load_shard(self, param: str, index: int, full: Narrowable) -> torch.Tensor:
        n = self.sizes[index]
        start = sum(self.sizes[:index])
        target = self.weight if param == "weight" else self.bias
        assert target is not None  # shards() lists a bias only when there is one
        return target[start : start + n].copy_(full.narrow(0, TP.rank * n, n))

    def hf_tensor(self, param: str, index: int) -> torch.Tensor:
        target = self.weight if param == "weight" else self.bias
        assert target is not None
        start = sum(self.sizes[:index])
        part = target.detach()[start : start + self.sizes[index]]
        if param == "weight" and (g := self.folded_norm) is not None:
            # unfolded to the dtype's rounding; a column the norm zeroes is zero (it never reaches the output)
            g = g.float()
            part = torch.where(g != 0, part.float() / torch.where(g != 0, g, 1), 0).to(part.dtype)
        return part

    def forward(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        return _linear(x, self.weight, self.quant, self.bias if with_bias else None, self.cpu_ops)


class ReplicatedLinear(Loadable):
    """y = x W^T with the whole W on every rank (a MoE router)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RowParallelLinear(Loadable):
    """y = x W^T with W's input columns split over ranks; partial sums are all-reduced."""

    cpu_ops = False  # use_cpu_ops(), on one process

    if TYPE_CHECKING:  # nn.Module types every call as returning Any

        def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        if in_features % TP.size:
            raise ValueError(f"input size {in_features} does not divide by tensor-parallel size {TP.size}")
        self.in_per_rank = in_features // TP.size
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank), requires_grad=False)

    def full_shape(self, param: str, index: int) -> tuple[int, ...]:
        return (self.weight.shape[0], self.in_per_rank * TP.size)

    def load_shard(self, param: str, index: int, full: Narrowable) -> torch.Tensor:
        return self.weight.copy_(full.narrow(1, TP.rank * self.in_per_rank, self.in_per_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return TP.all_reduce(_linear(x, self.weight, self.quant, cpu=self.cpu_ops))

    def add_into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """out += x W^T (all-reduced), the add in the GEMM itself (beta 1): no kernel of its own. Under tensor
        parallelism rank 0 adds its part to `out` and the others replace `out` by theirs, so the all-reduce leaves
        out + every part on every rank."""
        if TP.rank == 0:
            out.addmm_(x, self.weight.t())
        else:
            torch.mm(x, self.weight.t(), out=out)
        TP.all_reduce(out)


class VocabParallelEmbedding(Loadable):
    """Embedding rows split over ranks; each rank looks up its own range, the sum is all-reduced."""

    cpu_ops = False  # use_cpu_ops(), on one process

    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.per_rank = math.ceil(vocab / TP.size)
        self.start = TP.rank * self.per_rank
        self.vocab = vocab
        self.weight = nn.Parameter(torch.zeros(self.per_rank, dim), requires_grad=False)

    def full_shape(self, param: str, index: int) -> tuple[int, ...]:
        return (self.vocab, self.weight.shape[1])

    def load_shard(self, param: str, index: int, full: Narrowable) -> torch.Tensor:
        n = min(self.per_rank, self.vocab - self.start)
        return self.weight[:n].copy_(full.narrow(0, self.start, n))

    def hf_tensor(self, param: str, index: int) -> torch.Tensor:
        return self.weight.detach()[: self.vocab]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.cpu_ops:  # a C call, so that a recorded decode step (engine/cpu_graph.py) includes the lookup
            return cpu_ops.embedding(ids, self.weight)
        if TP.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.per_rank)
        out = F.embedding(local.clamp(0, self.per_rank - 1), self.weight) * inside.unsqueeze(-1)
        return TP.all_reduce(out)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM head over this rank's vocab rows, gathered into the full vocabulary."""
        full = TP.all_gather_last_dim(_linear(h, self.weight, self.quant, cpu=self.cpu_ops))
        return full[..., : self.vocab]


def cpu_weight_layout(model: nn.Module) -> None:
    """On a CPU: store each linear layer's [out, in] weight with `in` as the outer dimension (the same tensor, its
    storage transposed). F.linear multiplies by W^T, which is then one contiguous [in, out] matrix, and MKL streams
    that faster at one row per step (decode): SmolLM2-135M fp32 single stream 1.20x on the project's AVX2 machine,
    same tokens (benchmarks/cpu_weight_layout_ab.py, docs/benchmarks.md)."""
    for mod in model.modules():
        if isinstance(mod, ColumnParallelLinear | RowParallelLinear | ReplicatedLinear | VocabParallelEmbedding):
            if mod.weight.dim() == 2 and mod.weight.is_contiguous():
                mod.weight.data = mod.weight.data.t().contiguous().t()


def use_cpu_ops(model: nn.Module) -> None:
    """Run the model's embedding lookup, RMSNorms, rotary embedding and SiLU-and-mul through the C kernels
    (kernels/cpu_ops.py, fp32 on a CPU, one process, loaded by the caller): the modules that can declare a `cpu_ops`
    flag."""
    for mod in model.modules():
        if hasattr(type(mod), "cpu_ops"):
            setattr(mod, "cpu_ops", True)  # noqa: B010  # nn.Module types attribute writes as tensors or modules


class RMSNorm(Loadable):
    cpu_ops = False  # use_cpu_ops()

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and (ops := fused_ops()) is not None:
            return ops.rmsnorm(x, self.weight, self.eps)
        if self.cpu_ops:
            return cpu_ops.rmsnorm(x, self.weight, self.eps).view(x.shape)
        if x.dtype == torch.float32 and not x.is_cuda:
            # torch's fused CPU kernel: bitwise equal to the formula below in fp32 (checked on 200 random inputs),
            # one op instead of six; 35 vs 53 us per call at SmolLM2's width on the 2-core machine.
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """norm(x + residual), returning the new residual too."""
        if x.is_cuda and (ops := fused_ops()) is not None:
            return ops.rmsnorm(x, self.weight, self.eps, residual), residual  # residual updated in place
        if self.cpu_ops:
            return cpu_ops.rmsnorm(x, self.weight, self.eps, residual), residual  # residual updated in place
        residual = x + residual
        return self.forward(residual), residual


def rope_freq_factors(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    """What each rope frequency is divided by under scaling `s`: a GGUF's own factors (kind freq_factors, read from
    its rope_freqs.weight), or llama3 scaling's, computed from its four numbers as llama.cpp's convert_hf_to_gguf.py
    computes the factors it writes into rope_freqs.weight (transformers' llama3 inv_freq is inv_freq / these)."""
    kind = s.get("rope_type", s.get("type"))
    if kind == "freq_factors":
        return torch.tensor(s["factors"], dtype=torch.float64)
    if kind != "llama3":
        raise ValueError(f"unsupported rope scaling type {kind!r} (supported: llama3, freq_factors)")
    factor, lo, hi = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    mid = 1 / ((1 - smooth) / factor + smooth)  # between the two: interpolated
    low = torch.full_like(inv_freq, factor)  # wavelengths beyond old_ctx / lo: slowed by `factor`
    return torch.where(wavelen > old_ctx / lo, low, torch.where(wavelen < old_ctx / hi, torch.ones_like(mid), mid))


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (rotate halves), as in HF Llama and Qwen3 checkpoints."""

    cos_sin: torch.Tensor  # a buffer: [max_pos, head_dim] fp32, cos | sin
    cpu_ops = False  # use_cpu_ops()

    def __init__(self, head_dim: int, max_pos: int, theta: float, scaling: dict[str, Any] | None):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        if scaling:
            inv_freq = inv_freq / rope_freq_factors(inv_freq, scaling)
        t = torch.arange(max_pos, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], dim=-1).float(), persistent=False)
        self._pos: torch.Tensor | None = None  # the positions of the last lookup (None: none yet), and its cos / sin
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if q.is_cuda and (ops := fused_ops()) is not None:
            ops.rope_inplace(q, k, self.cos_sin, pos)
            return q, k
        if self.cpu_ops:
            cpu_ops.rope_(q, self.cos_sin, pos)
            cpu_ops.rope_(k, self.cos_sin, pos)
            return q, k
        if pos is not self._pos:  # one lookup per step: every layer rotates at the same positions
            cos, sin = self.cos_sin.index_select(0, pos).unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2]
            self._pos, self._cos_sin = pos, (cos, sin)
        assert self._cos_sin is not None
        return _rotate(q, *self._cos_sin), _rotate(k, *self._cos_sin)


def silu_and_mul(x: torch.Tensor, cpu: bool = False) -> torch.Tensor:
    """silu(gate) * up of x = gate | up; `cpu`: through kernels/cpu_ops (a module that use_cpu_ops() switched)."""
    if x.is_cuda and (ops := fused_ops()) is not None:
        return ops.silu_and_mul(x)
    if cpu:
        return cpu_ops.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
