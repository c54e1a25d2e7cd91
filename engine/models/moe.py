"""Mixture-of-experts MLP (Qwen3-MoE): a softmax router picks the top-k experts of each token, each a SiLU-gated MLP;
their outputs are summed with the router's weights.

Under tensor parallelism every rank holds every expert's slice of the intermediate dimension (the experts split as
the dense MLP does), so a layer ends in one all-reduce, as the dense MLP's down projection does. On CUDA the experts
run as the fused Triton kernel (kernels/fused_moe.py: two grouped-GEMM launches, no host syncs, so CUDA graphs
capture it); the torch loop over experts below is the reference and the CPU path."""

from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed import TP
from engine.layers import Loadable, Narrowable, ReplicatedLinear, silu_and_mul
from engine.model_config import ModelConfig

EXPERT_PROJ = ("gate", "up", "down")  # checkpoint tensors of one expert: index 3 * expert + position here


@functools.cache
def fused_moe_ops() -> ModuleType | None:
    if not torch.cuda.is_available():
        return None
    try:
        from kernels import fused_moe
    except ImportError:
        return None
    return fused_moe


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts (in float32), the top-k of each token, optionally rescaled to sum to 1.
    Returns (weights [T, k] in the logits' dtype, expert ids [T, k])."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), ids


def moe_reference(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]), one expert at a time. x: [T, H], w13: [E, 2I, H] (gate rows,
    then up rows), w2: [E, H, I]. Reads the chosen experts back to the host: not for CUDA graphs."""
    out = torch.zeros_like(x)
    for e in sorted(set(ids.flatten().tolist())):
        slot, tok = torch.where(ids.T == e)
        h = F.linear(silu_and_mul(F.linear(x[tok], w13[e])), w2[e])
        out.index_add_(0, tok, (h * weights[tok, slot, None]).to(out.dtype))
    return out


class Experts(Loadable):
    """All experts of one layer, stacked: w13 [E, 2 * I/tp, H] (this rank's gate rows, then its up rows) and
    w2 [E, H, I/tp]. Checkpoint tensor (weight, 3e + k) is expert e's EXPERT_PROJ[k] projection."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.num_experts, self.hidden, self.inter = num_experts, hidden, intermediate // TP.size
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.inter, hidden), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, self.inter), requires_grad=False)

    def shards(self) -> list[tuple[str, int]]:
        return [("weight", i) for i in range(len(EXPERT_PROJ) * self.num_experts)]

    def full_shape(self, param: str, index: int) -> tuple[int, ...]:
        full = self.inter * TP.size
        return (self.hidden, full) if index % 3 == 2 else (full, self.hidden)

    def load_shard(self, param: str, index: int, full: Narrowable) -> torch.Tensor:
        e, k = divmod(index, 3)
        n, start = self.inter, TP.rank * self.inter
        if k == 2:
            return self.w2[e].copy_(full.narrow(1, start, n))
        return self.w13[e, k * n : (k + 1) * n].copy_(full.narrow(0, start, n))

    def hf_tensor(self, param: str, index: int) -> torch.Tensor:
        e, k = divmod(index, 3)
        n = self.inter
        return self.w2[e].detach() if k == 2 else self.w13[e, k * n : (k + 1) * n].detach()

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum of the chosen experts' outputs ([T, H]; the caller all-reduces)."""
        if x.is_cuda and (ops := fused_moe_ops()) is not None:
            out: torch.Tensor = ops.fused_moe(x, self.w13, self.w2, weights, ids)
            return out
        return moe_reference(x, self.w13, self.w2, weights, ids)


class SparseMoE(nn.Module):
    """Router (`gate`, replicated on every rank) and experts; HF Qwen3-MoE checkpoint names."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = ReplicatedLinear(cfg.hidden_size, cfg.num_experts)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        return TP.all_reduce(self.experts(x, weights, ids))
