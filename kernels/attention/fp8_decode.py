"""Decode attention over an fp8 (e4m3) KV pool, in Triton (Hopper; `--kv-cache-dtype fp8`).

FlashInfer 0.7's decode widens fp8 K/V to 16 bits on their way through shared memory, which caps its read of an fp8 pool
at ~2.1 TB/s (H100) and 1.2-2.4 TB/s (H200, 32-256 rows): on an H200 no faster than a bf16 pool at 256 rows. Here the
keys go to the tensor cores as they are stored. The query is split into two e4m3 terms at a power-of-two scale, q ~ hi +
lo, so q.k is two fp8 MMAs and the query keeps ~7 significant bits (bf16 keeps 8): the output's error against exact
attention over the stored K/V is FlashInfer's (2.1e-3). Rounding the query to one e4m3 term, as vLLM does for
FlashAttention-3's fp8 path, was ~10% faster here but had 13x the error (2.7e-2). The values are widened to fp16 in
registers, and both MMAs are transposed (K q^T, V^T P) so the widened tile is the A operand, which wgmma reads from
registers.

One program per (work item, KV head): a work item is a span of one request's keys, its query heads the N side of the
MMA (padded to 16). A request cut into several spans gets a second kernel that merges them by their log-sum-exp. The
engine calls it through span_decode.SpanDecodeWrapper, which cuts the spans so that every program reads about as
many keys (span_decode_work) and keeps their metadata in fixed buffers for CUDA graphs.

H200, Qwen3-0.6B's heads (16 query, 8 KV), one layer (`benchmarks/decode_attention_kernels.py`; docs/gpu.md): 212
against 299 us (FlashInfer fp8) and 273 us (FlashInfer bf16) at 256 rows of the offline workload; 662 against 783
and 884 us at 256 rows of the saturated replay's lengths."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention.span_decode import KEYS_PER_STEP as BLOCK_N
from kernels.attention.span_decode import MERGE_SPANS as MERGE_BLOCK

LOG2E = 1.4426950408889634
NUM_STAGES = 3
NUM_WARPS = 4
# The work items are run-time data, so one build of each kernel serves every batch (a build per split count compiled
# mid-run was a 1.1 s stall in a replay's mixed step). The merge takes up to MERGE_BLOCK spans of a request.


@triton.jit
def _decode(
    Q,
    K,
    V,
    Indptr,
    Indices,
    Work,  # int32 [3, items]: request (-1: no work), first key, end key
    WorkPtr,  # int32 [requests + 1]: each request's items, from WorkPtr[r] to WorkPtr[r + 1]
    Out,
    Part,  # fp32 [items, heads, D]: a span's normalized output (requests cut into several spans)
    Lse,  # fp32 [items, heads]: its log-sum-exp (base 2)
    qk_scale,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_w,
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    item = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.load(Work + item)
    if b < 0:
        return
    start = tl.load(Work + stride_w + item)
    end = tl.load(Work + 2 * stride_w + item)
    alone = tl.load(WorkPtr + b + 1) - tl.load(WorkPtr + b) == 1
    H = tl.num_programs(1) * G
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
        # V gathered byte by byte into the MMA's layout. Loading it as stored and transposing in 16 bits takes 38% fewer
        # instructions but 90 KB of shared memory (2 programs per SM, not 3): 10-14% slower at 256 rows (H200).
        vt = tl.load(V + off[None, :] + d[:, None], mask=valid[None, :], other=0.0).to(tl.float16)
        acc = acc * alpha[None, :] + tl.dot(vt, p.to(tl.float16))
        m = m_new
    if alone:
        o = acc / l_sum[None, :]
        row = b * H + heads
        tl.store(Out + row[None, :] * D + d[:, None], o.to(Out.dtype.element_ty), mask=(g < G)[None, :])
    else:
        at = item * H + heads
        safe = tl.where(l_sum > 0, l_sum, 1.0)  # an empty span (none planned) would weigh 0 in the merge
        tl.store(Part + at[None, :] * D + d[:, None], acc / safe[None, :], mask=(g < G)[None, :])
        tl.store(Lse + at, tl.where(l_sum > 0, m + tl.log2(safe), float("-inf")), mask=g < G)


@triton.jit
def _merge(Out, Part, Lse, WorkPtr, H, D: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0)  # request * heads + head
    b = row // H
    h = row % H
    first = tl.load(WorkPtr + b)
    n = tl.load(WorkPtr + b + 1) - first
    if n == 1:  # written by its one span
        return
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    at = (first + s) * H + h
    lse = tl.load(Lse + at, mask=s < n, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))
    part = tl.load(Part + at[:, None] * D + d[None, :], mask=(s < n)[:, None], other=0.0)
    o = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
    tl.store(Out + row * D + d, o.to(Out.dtype.element_ty))


def decode(
    q: torch.Tensor,  # [rows, heads, dim], last dim contiguous
    k_cache: torch.Tensor,  # [pages, page, kv_heads, dim], float8_e4m3fn
    v_cache: torch.Tensor,
    indptr: torch.Tensor,  # int32 [rows + 1] into indices (device)
    indices: torch.Tensor,  # int32 page ids (device)
    work: torch.Tensor,  # int32 [3, items] (device): see _decode
    work_ptr: torch.Tensor,  # int32 [rows + 1] (device)
    sm_scale: float,
    part: torch.Tensor | None,  # fp32, at least items * heads * dim (None: no request has several spans)
    lse: torch.Tensor | None,  # fp32, at least items * heads
    out: torch.Tensor | None = None,  # contiguous [rows, heads, dim]
) -> torch.Tensor:
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q) if out is None else out
    items = work.shape[1]
    assert out.is_contiguous() and q.stride(2) == 1 and work.stride(1) == 1
    merge = part is not None and lse is not None
    _decode[(items, kv_heads)](
        q,
        k_cache,
        v_cache,
        indptr,
        indices,
        work,
        work_ptr,
        out,
        part if merge else out,
        lse if merge else out,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        work.stride(0),
        G=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        D=dim,
        PAGE=k_cache.shape[1],
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    if part is not None and lse is not None:
        merge_spans(out, part, lse, work_ptr, rows, heads)
    return out


def merge_spans(
    out: torch.Tensor, part: torch.Tensor, lse: torch.Tensor, work_ptr: torch.Tensor, rows: int, heads: int
) -> None:
    """Each request cut into several spans: its spans' outputs weighed by their log-sum-exps, into `out`."""
    _merge[(rows * heads,)](out, part, lse, work_ptr, heads, D=out.shape[-1], BLOCK_S=MERGE_BLOCK)
