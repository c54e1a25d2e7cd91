"""Fused mixture-of-experts MLP (Triton) for CUDA: the (token, expert) pairs of a batch are sorted by expert into
blocks of BLOCK_M rows that each belong to one expert, then one grouped-GEMM launch computes every block's gate/up
projection, the existing SiLU*mul kernel gates it, and a second launch computes the down projection with the router
weight of each pair multiplied in; the k rows of a token are summed last.

Everything is device-side with shapes fixed by the number of tokens (the sorted layout is padded to its largest
possible size; blocks past the real end exit at once), so it runs under CUDA-graph capture. The reference is the
torch loop in engine/models/moe.py, which this must match within bf16 rounding (tests/test_gpu.py).

Layout as in vLLM's and SGLang's fused_moe (sorted token ids, one expert id per block); the code is this project's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_ops import silu_and_mul


@triton.jit
def _moe_gemm_kernel(
    a_ptr,  # [rows of A, K]: the tokens (first GEMM, row = pair // top_k) or the pairs (second GEMM)
    b_ptr,  # [E, N, K]: each expert's weight, as nn.Linear stores it
    c_ptr,  # [pairs, N]
    w_ptr,  # [pairs]: router weight of each pair (read when MUL_WEIGHT)
    sorted_ptr,  # [EM]: pair index at each sorted row; `num_pairs` in padding rows
    expert_ptr,  # [EM // BLOCK_M]: the expert of each block of sorted rows
    end_ptr,  # [1]: sorted rows in use (padding included); later blocks have nothing to do
    N,
    K,
    EM,
    num_pairs,
    stride_am,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    A_ROW_DIV: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped launch order: GROUP_M row blocks share each column block while it is in L2.
    pid = tl.program_id(0)
    num_m = tl.cdiv(EM, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % size_m
    pid_n = (pid % (GROUP_M * num_n)) // size_m
    if pid_m * BLOCK_M >= tl.load(end_ptr):
        return

    rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = rows < num_pairs
    expert = tl.load(expert_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rows // A_ROW_DIV).to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:  # float32 activations: full precision, not tf32
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    if MUL_WEIGHT:
        acc = acc * tl.load(w_ptr + rows, mask=valid, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


def block_config(num_pairs: int, num_experts: int) -> dict[str, int]:
    """Tile sizes: small row blocks when each expert gets few rows (decode), larger ones for prefill."""
    per_expert = num_pairs / num_experts
    if per_expert <= 16:
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3)
    if per_expert <= 64:
        return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)


def sort_by_expert(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (token, slot) pairs (flat index t * k + j) grouped by expert, each expert's group padded to a multiple of
    block_m with the index `pairs` (a row to skip). Returns (sorted pair ids [EM], expert of each block [EM / block_m],
    rows in use [1]); EM is the largest size the padding can reach, so shapes depend on the batch size only."""
    flat = ids.reshape(-1)
    pairs = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = flat.argsort(stable=True)  # pair ids, by expert
    expert_of = flat[order]
    first = counts.cumsum(0) - counts  # where each expert's pairs start in `order`
    dest = ends[expert_of] - padded[expert_of] + torch.arange(pairs, device=ids.device) - first[expert_of]
    em = triton.cdiv(pairs + min(num_experts, pairs) * (block_m - 1), block_m) * block_m
    sorted_ids = torch.full((em,), pairs, dtype=torch.int64, device=ids.device)
    sorted_ids[dest] = order
    block_starts = torch.arange(0, em, block_m, device=ids.device)
    block_expert = torch.searchsorted(ends, block_starts, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, block_expert, ends[-1:]


def _grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    weights: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    end: torch.Tensor,
    a_row_div: int,
    mul_weight: bool,
    cfg: dict[str, int],
) -> None:
    E, N, K = w.shape
    em = sorted_ids.numel()
    grid = (triton.cdiv(em, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    _moe_gemm_kernel[grid](
        a,
        w,
        out,
        weights,
        sorted_ids,
        block_expert,
        end,
        N,
        K,
        em,
        out.shape[0],
        a.stride(0),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        A_ROW_DIV=a_row_div,
        MUL_WEIGHT=mul_weight,
        IEEE=a.dtype == torch.float32,
        **cfg,
    )


def fused_moe(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]). x: [T, H]; w13: [E, 2I, H] (gate rows, then up rows);
    w2: [E, H, I]; weights, ids: [T, k]. Returns [T, H] in x's dtype."""
    T, H = x.shape
    E, top_k = w13.shape[0], ids.shape[1]
    if T == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    pairs = T * top_k
    cfg = block_config(pairs, E)
    sorted_ids, block_expert, end = sort_by_expert(ids, E, cfg["BLOCK_M"])
    flat_weights = weights.reshape(-1).contiguous()
    gate_up = torch.empty(pairs, w13.shape[1], dtype=x.dtype, device=x.device)
    _grouped_gemm(x, w13, gate_up, flat_weights, sorted_ids, block_expert, end, top_k, False, cfg)
    act = silu_and_mul(gate_up)
    down = torch.empty(pairs, H, dtype=x.dtype, device=x.device)
    _grouped_gemm(act, w2, down, flat_weights, sorted_ids, block_expert, end, 1, True, cfg)
    return down.view(T, top_k, H).sum(dim=1)
