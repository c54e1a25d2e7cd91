"""Decode attention over an fp8 (e4m3) KV pool, in Triton (Hopper; `--kv-cache-dtype fp8`).

FlashInfer 0.7's decode widens fp8 K/V to 16 bits on their way through shared memory, which caps its read of an fp8 pool
at ~2.1 TB/s (H100) and 1.2-2.4 TB/s (H200, 32-256 rows): on an H200 no faster than a bf16 pool at 256 rows. Here the
keys go to the tensor cores as they are stored. The query is split into two e4m3 terms at a power-of-two scale, q ~ hi +
lo, so q.k is two fp8 MMAs and the query keeps ~7 significant bits (bf16 keeps 8): the output's error against exact
attention over the stored K/V is FlashInfer's (2.1e-3). Rounding the query to one e4m3 term, as vLLM does for
FlashAttention-3's fp8 path, was ~10% faster here but had 13x the error (2.7e-2). The values are widened to fp16 in
registers, and both MMAs are transposed (K q^T, V^T P) so the widened tile is the A operand, which wgmma reads from
registers.

One program per (request, KV head, split): its query heads are the N side of the MMA (padded to 16). With more than
one split per request a second kernel merges the splits by their log-sum-exp. The engine calls it through
flashinfer_backend.Fp8DecodeWrapper, which plans the metadata and the split count.

H200, Qwen3-0.6B's heads (16 query, 8 KV), one layer (`benchmarks/decode_attention_kernels.py`; docs/gpu.md): 212
against 299 us (FlashInfer fp8) and 273 us (FlashInfer bf16) at 256 rows of the offline workload; 662 against 783
and 884 us at 256 rows of the saturated replay's lengths."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
BLOCK_N = 128  # keys per step of the loop: 64 and 256 were 10-43% slower (H200), as were 8 warps
NUM_STAGES = 3
# The split count is a run-time argument, so two builds of the kernel (split or not) serve every batch: a build per
# count compiled mid-run (a 1.1 s stall in a replay's mixed step). The merge takes up to MERGE_BLOCK splits.
MERGE_BLOCK = 32


@triton.jit
def _decode(
    Q,
    K,
    V,
    Indptr,
    Indices,
    Lens,
    Out,
    Part,
    Lse,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    splits,
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    H = tl.num_programs(1) * G
    length = tl.load(Lens + b)
    chunk = tl.cdiv(tl.cdiv(length, splits), BLOCK_N) * BLOCK_N
    start = s * chunk
    end = tl.minimum(length, start + chunk)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    heads = kvh * G + g
    qt = tl.load(Q + b * stride_qb + heads[None, :] * stride_qh + d[:, None], mask=(g < G)[None, :], other=0.0)
    qt = qt.to(tl.float32) * qk_scale  # scores in base 2
    amax = tl.max(tl.abs(qt), 0)
    q_scale = tl.where(amax > 0, tl.exp2(tl.floor(tl.log2(448.0 / tl.where(amax > 0, amax, 1.0)))), 1.0)
    qt = qt * q_scale[None, :]
    q_hi = qt.to(tl.float8e4nv)
    q_lo = (qt - q_hi.to(tl.float32)).to(tl.float8e4nv)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([D, BLOCK_G], tl.float32)
    base = tl.load(Indptr + b)
    for n0 in tl.range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        valid = n < end
        page = tl.load(Indices + base + n // PAGE, mask=valid, other=0).to(tl.int64)
        off = page * stride_kp + (n % PAGE) * stride_ks + kvh * stride_kh
        k = tl.load(K + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        st = tl.dot(k, q_lo, tl.dot(k, q_hi)) / q_scale[None, :]
        st = tl.where(valid[:, None], st, float("-inf"))
        m_new = tl.maximum(m, tl.max(st, 0))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(st - m_new[None, :])
        l_sum = l_sum * alpha + tl.sum(p, 0)
        vt = tl.load(V + off[None, :] + d[:, None], mask=valid[None, :], other=0.0).to(tl.float16)
        acc = acc * alpha[None, :] + tl.dot(vt, p.to(tl.float16))
        m = m_new
    row = b * H + heads
    if not SPLIT:
        o = acc / l_sum[None, :]
        tl.store(Out + row[None, :] * D + d[:, None], o.to(Out.dtype.element_ty), mask=(g < G)[None, :])
    else:  # an empty split (a request shorter than the others) leaves log-sum-exp -inf: weight 0 in the merge
        safe = tl.where(l_sum > 0, l_sum, 1.0)
        tl.store(Part + (row[None, :] * splits + s) * D + d[:, None], acc / safe[None, :], mask=(g < G)[None, :])
        tl.store(Lse + row * splits + s, tl.where(l_sum > 0, m + tl.log2(safe), float("-inf")), mask=g < G)


@triton.jit
def _merge(Out, Part, Lse, splits, D: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    lse = tl.load(Lse + row * splits + s, mask=s < splits, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))
    part = tl.load(Part + (row * splits + s[:, None]) * D + d[None, :], mask=(s < splits)[:, None], other=0.0)
    o = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
    tl.store(Out + row * D + d, o.to(Out.dtype.element_ty))


def decode(
    q: torch.Tensor,  # [rows, heads, dim], last dim contiguous
    k_cache: torch.Tensor,  # [pages, page, kv_heads, dim], float8_e4m3fn
    v_cache: torch.Tensor,
    indptr: torch.Tensor,  # int32 [rows + 1] into indices (device)
    indices: torch.Tensor,  # int32 page ids (device)
    lens: torch.Tensor,  # int32 [rows] context lengths (device)
    sm_scale: float,
    splits: int,
    out: torch.Tensor | None = None,  # contiguous [rows, heads, dim]
) -> torch.Tensor:
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q) if out is None else out
    assert out.is_contiguous() and q.stride(2) == 1 and 1 <= splits <= MERGE_BLOCK
    part = lse = out
    if splits > 1:
        part = torch.empty(rows * heads * splits * dim, device=q.device, dtype=torch.float32)
        lse = torch.empty(rows * heads * splits, device=q.device, dtype=torch.float32)
    _decode[(rows, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        indptr,
        indices,
        lens,
        out,
        part,
        lse,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        splits,
        G=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        D=dim,
        PAGE=k_cache.shape[1],
        BLOCK_N=BLOCK_N,
        SPLIT=splits > 1,
        num_warps=4,
        num_stages=NUM_STAGES,
    )
    if splits > 1:
        _merge[(rows * heads,)](out, part, lse, splits, D=dim, BLOCK_S=MERGE_BLOCK)
    return out
