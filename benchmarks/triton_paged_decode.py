"""A paged decode-attention kernel in Triton, bf16 or fp8 (e4m3) K/V, for benchmarks/decode_attention_kernels.py (GPU).

A candidate against FlashInfer's decode, whose tensor-core path reads an fp8 pool at only ~2.1 TB/s on an H100
(docs/gpu.md, "An fp8 KV cache"). One program per (request, KV head, split): the query heads of its group are the
rows of one MMA tile (padded to 16), K/V come page by page from the engine's NHD pool [pages, page, kv_heads, dim],
fp8 is widened to fp16 in registers (one cvt per two values), the dot products accumulate in fp32, the softmax
runs online in base 2. With more than one split per request, a second kernel merges the splits by their
log-sum-exp. Not used by the engine: it stays here unless it beats FlashInfer (the benchmark decides)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _decode_split(
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
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    FP16_DOT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    H = tl.num_programs(1) * G
    length = tl.load(Lens + b)
    chunk = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    start = s * chunk
    end = tl.minimum(length, start + chunk)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    heads = kvh * G + g
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=(g < G)[:, None], other=0.0)
    q = q.to(tl.float32) * qk_scale
    q = q.to(tl.float16) if FP16_DOT else q.to(tl.bfloat16)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    base = tl.load(Indptr + b)
    for n0 in tl.range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        valid = n < end
        page = tl.load(Indices + base + n // PAGE, mask=valid, other=0).to(tl.int64)
        off = page * stride_kp + (n % PAGE) * stride_ks + kvh * stride_kh
        k = tl.load(K + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        k = k.to(tl.float16) if FP16_DOT else k.to(tl.bfloat16)
        qk = tl.dot(q, tl.trans(k))
        qk = tl.where(valid[None, :], qk, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        v = tl.load(V + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        v = v.to(tl.float16) if FP16_DOT else v.to(tl.bfloat16)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    row = b * H + heads
    if SPLITS == 1:
        o = acc / l_sum[:, None]
        tl.store(Out + row[:, None] * D + d[None, :], o.to(Out.dtype.element_ty), mask=(g < G)[:, None])
    else:
        safe = tl.where(l_sum > 0, l_sum, 1.0)
        tl.store(Part + (row[:, None] * SPLITS + s) * D + d[None, :], acc / safe[:, None], mask=(g < G)[:, None])
        tl.store(Lse + row * SPLITS + s, tl.where(l_sum > 0, m + tl.log2(safe), float("-inf")), mask=g < G)


@triton.jit
def _decode_split_swapped(
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
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    FP16_DOT: tl.constexpr,
    QK_FP8: tl.constexpr = 0,
):
    """_decode_split with the MMAs transposed (K @ q^T, V^T @ P): the widened K/V tile is the MMA's A operand,
    which Hopper's wgmma takes from registers, so it need not go back through shared memory after the widening."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    H = tl.num_programs(1) * G
    length = tl.load(Lens + b)
    chunk = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    start = s * chunk
    end = tl.minimum(length, start + chunk)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    heads = kvh * G + g
    qt = tl.load(Q + b * stride_qb + heads[None, :] * stride_qh + d[:, None], mask=(g < G)[None, :], other=0.0)
    qt = qt.to(tl.float32) * qk_scale
    if QK_FP8 == 1:  # K stays e4m3 and the query is rounded to it, as FlashAttention-3's and XQA's fp8 kernels do
        qt = qt.to(tl.float8e4nv)
    elif QK_FP8 == 2:  # K stays e4m3; the query is the sum of two e4m3 terms (~7 bits) at a power-of-two scale
        amax = tl.max(tl.abs(qt), 0)
        q_scale = tl.where(amax > 0, tl.exp2(tl.floor(tl.log2(448.0 / tl.where(amax > 0, amax, 1.0)))), 1.0)
        qt = qt * q_scale[None, :]
        q_hi = qt.to(tl.float8e4nv)
        q_lo = (qt - q_hi.to(tl.float32)).to(tl.float8e4nv)
    else:
        qt = qt.to(tl.float16) if FP16_DOT else qt.to(tl.bfloat16)
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
        if QK_FP8 == 2:
            st = tl.dot(k, q_lo, tl.dot(k, q_hi)) / q_scale[None, :]
        elif QK_FP8 == 1:
            st = tl.dot(k, qt)
        else:
            k = k.to(tl.float16) if FP16_DOT else k.to(tl.bfloat16)
            st = tl.dot(k, qt)
        st = tl.where(valid[:, None], st, float("-inf"))
        m_new = tl.maximum(m, tl.max(st, 0))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(st - m_new[None, :])
        l_sum = l_sum * alpha + tl.sum(p, 0)
        vt = tl.load(V + off[None, :] + d[:, None], mask=valid[None, :], other=0.0)
        vt = vt.to(tl.float16) if FP16_DOT else vt.to(tl.bfloat16)
        acc = acc * alpha[None, :] + tl.dot(vt, p.to(vt.dtype))
        m = m_new
    row = b * H + heads
    if SPLITS == 1:
        o = acc / l_sum[None, :]
        tl.store(Out + row[None, :] * D + d[:, None], o.to(Out.dtype.element_ty), mask=(g < G)[None, :])
    else:
        safe = tl.where(l_sum > 0, l_sum, 1.0)
        tl.store(Part + (row[None, :] * SPLITS + s) * D + d[:, None], acc / safe[None, :], mask=(g < G)[None, :])
        tl.store(Lse + row * SPLITS + s, tl.where(l_sum > 0, m + tl.log2(safe), float("-inf")), mask=g < G)


@triton.jit
def _merge(Out, Part, Lse, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    lse = tl.load(Lse + row * SPLITS + s, mask=s < SPLITS, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))
    part = tl.load(Part + (row * SPLITS + s[:, None]) * D + d[None, :], mask=(s < SPLITS)[:, None], other=0.0)
    o = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
    tl.store(Out + row * D + d, o.to(Out.dtype.element_ty))


def paged_decode(
    q: torch.Tensor,  # [rows, heads, dim]
    k_cache: torch.Tensor,  # [pages, page, kv_heads, dim], bf16/fp16 or float8_e4m3fn
    v_cache: torch.Tensor,
    indptr: torch.Tensor,  # int32 [rows + 1] into indices (device)
    indices: torch.Tensor,  # int32 page ids (device)
    lens: torch.Tensor,  # int32 [rows] context lengths (device)
    sm_scale: float,
    splits: int = 1,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    swapped: bool = False,
    qk_fp8: int = 0,  # swapped only, fp8 pool only: 1 the query rounded to e4m3, 2 as two e4m3 terms
) -> torch.Tensor:
    rows, heads, dim = q.shape
    _, page, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    out = torch.empty_like(q)
    fp16 = k_cache.dtype == torch.float8_e4m3fn or q.dtype == torch.float16
    part = lse = out
    if splits > 1:
        part = torch.empty(rows * heads * splits * dim, device=q.device, dtype=torch.float32)
        lse = torch.empty(rows * heads * splits, device=q.device, dtype=torch.float32)
    kernel = _decode_split_swapped if swapped else _decode_split
    kernel[(rows, kv_heads, splits)](
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
        G=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        D=dim,
        PAGE=page,
        BLOCK_N=block_n,
        SPLITS=splits,
        FP16_DOT=fp16,
        **({"QK_FP8": qk_fp8} if swapped else {}),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if splits > 1:
        _merge[(rows * heads,)](out, part, lse, D=dim, SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits))
    return out
