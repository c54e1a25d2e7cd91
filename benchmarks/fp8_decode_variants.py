"""Candidate changes to the fp8 decode kernel (kernels/attention/fp8_decode.py), timed beside it by
benchmarks/decode_attention_kernels.py as `triton-<variant>[-sS][-stN][-wW][-bB]` (GPU; issues #15 and #17):

  base   the engine's kernel at other settings (stages, warps, keys per step)
  dsum   the engine's kernel with the softmax denominator kept per key row and summed once after the loop: one
         cross-warp reduction per step of the loop instead of two (the keys are the MMA's M side, spread over warps)
  allh   one program per (request, split) for every KV head: a step takes whole pages, token-major, so its rows are
         (token, KV head) pairs read as one contiguous block per page, and the N side of both MMAs is every query
         head of the request (16 for Qwen3-0.6B: no padding); a row's scores count only for its own KV head's query
         heads. The same MMA work as the engine's at a group of 2, with one page id per step
  allh-d allh with the deferred denominator
  pv8    the engine's kernel with V not widened: P as two e4m3 terms (scale 256) into fp8 MMAs with V as stored
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention.fp8_decode import LOG2E, MERGE_BLOCK, _decode, _merge


@triton.jit
def _query_terms(qt, qk_scale):
    """The query tile (any shape, query heads on axis 1) as two e4m3 terms at a power-of-two scale per head."""
    qt = qt.to(tl.float32) * qk_scale
    amax = tl.max(tl.abs(qt), 0)
    q_scale = tl.where(amax > 0, tl.exp2(tl.floor(tl.log2(448.0 / tl.where(amax > 0, amax, 1.0)))), 1.0)
    qt = qt * q_scale[None, :]
    q_hi = qt.to(tl.float8e4nv)
    q_lo = (qt - q_hi.to(tl.float32)).to(tl.float8e4nv)
    return q_hi, q_lo, q_scale


@triton.jit
def _decode_dsum(
    Q, K, V, Indptr, Indices, Lens, Out, Part, Lse, qk_scale,
    stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, splits,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
):  # fmt: skip
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
    q_hi, q_lo, q_scale = _query_terms(qt, qk_scale)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_rows = tl.zeros([BLOCK_N, BLOCK_G], tl.float32)
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
        l_rows = l_rows * alpha[None, :] + p
        vt = tl.load(V + off[None, :] + d[:, None], mask=valid[None, :], other=0.0).to(tl.float16)
        acc = acc * alpha[None, :] + tl.dot(vt, p.to(tl.float16))
        m = m_new
    l_sum = tl.sum(l_rows, 0)
    row = b * H + heads
    if not SPLIT:
        o = acc / l_sum[None, :]
        tl.store(Out + row[None, :] * D + d[:, None], o.to(Out.dtype.element_ty), mask=(g < G)[None, :])
    else:
        safe = tl.where(l_sum > 0, l_sum, 1.0)
        tl.store(Part + (row[None, :] * splits + s) * D + d[:, None], acc / safe[None, :], mask=(g < G)[None, :])
        tl.store(Lse + row * splits + s, tl.where(l_sum > 0, m + tl.log2(safe), float("-inf")), mask=g < G)


@triton.jit
def _decode_allh(
    Q, K, V, Indptr, Indices, Lens, Out, Part, Lse, qk_scale,
    stride_qb, stride_qh, stride_kp, splits,
    G: tl.constexpr, KVH: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    TOKENS: tl.constexpr, SPLIT: tl.constexpr, DEFER: tl.constexpr,
):  # fmt: skip
    # Rows of a step: TOKENS tokens x KVH heads, row r = (token r // KVH, head r % KVH); a page is contiguous
    # [PAGE, KVH, D], so TOKENS <= PAGE consecutive tokens of one page are one block of TOKENS * KVH * D bytes.
    b = tl.program_id(0)
    s = tl.program_id(1)
    H: tl.constexpr = KVH * G
    ROWS: tl.constexpr = TOKENS * KVH
    length = tl.load(Lens + b)
    chunk = tl.cdiv(tl.cdiv(length, splits), TOKENS) * TOKENS
    start = s * chunk
    end = tl.minimum(length, start + chunk)
    c = tl.arange(0, BLOCK_H)
    d = tl.arange(0, D)
    r = tl.arange(0, ROWS)
    qt = tl.load(Q + b * stride_qb + c[None, :] * stride_qh + d[:, None], mask=(c < H)[None, :], other=0.0)
    q_hi, q_lo, q_scale = _query_terms(qt, qk_scale)
    own = (r % KVH)[:, None] == (c // G)[None, :]  # a row's scores count for its own KV head's query heads only
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    if DEFER:
        l_rows = tl.zeros([ROWS, BLOCK_H], tl.float32)
    else:
        l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([D, BLOCK_H], tl.float32)
    base = tl.load(Indptr + b)
    for n0 in tl.range(start, end, TOKENS):
        page = tl.load(Indices + base + n0 // PAGE).to(tl.int64)
        tok = n0 + r // KVH
        valid = tok < end
        off = page * stride_kp + (n0 % PAGE) * (KVH * D) + r * D
        k = tl.load(K + off[:, None] + d[None, :])
        st = tl.dot(k, q_lo, tl.dot(k, q_hi)) / q_scale[None, :]
        st = tl.where(valid[:, None] & own, st, float("-inf"))
        m_new = tl.maximum(m, tl.max(st, 0))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(st - m_new[None, :])
        if DEFER:
            l_rows = l_rows * alpha[None, :] + p
        else:
            l_sum = l_sum * alpha + tl.sum(p, 0)
        vt = tl.load(V + off[None, :] + d[:, None]).to(tl.float16)
        vt = tl.where(valid[None, :], vt, 0.0)  # a page's unwritten slots may hold NaN bytes
        acc = acc * alpha[None, :] + tl.dot(vt, p.to(tl.float16))
        m = m_new
    if DEFER:
        l_sum = tl.sum(l_rows, 0)
    row = b * H + c
    if not SPLIT:
        o = acc / l_sum[None, :]
        tl.store(Out + row[None, :] * D + d[:, None], o.to(Out.dtype.element_ty), mask=(c < H)[None, :])
    else:
        safe = tl.where(l_sum > 0, l_sum, 1.0)
        tl.store(Part + (row[None, :] * splits + s) * D + d[:, None], acc / safe[None, :], mask=(c < H)[None, :])
        tl.store(Lse + row * splits + s, tl.where(l_sum > 0, m + tl.log2(safe), float("-inf")), mask=c < H)


@triton.jit
def _decode_pv8(
    Q, K, V, Indptr, Indices, Lens, Out, Part, Lse, qk_scale,
    stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, splits,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
):  # fmt: skip
    # The engine's kernel with V kept in e4m3 for the second MMA too: P (in [0, 1]) as two e4m3 terms at scale 256.
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
    q_hi, q_lo, q_scale = _query_terms(qt, qk_scale)
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
        vt = tl.load(V + off[None, :] + d[:, None], mask=valid[None, :], other=0.0)
        p = p * 256.0
        p_hi = p.to(tl.float8e4nv)
        p_lo = (p - p_hi.to(tl.float32)).to(tl.float8e4nv)
        acc = acc * alpha[None, :] + tl.dot(vt, p_lo, tl.dot(vt, p_hi)) * (1.0 / 256.0)
        m = m_new
    row = b * H + heads
    if not SPLIT:
        o = acc / l_sum[None, :]
        tl.store(Out + row[None, :] * D + d[:, None], o.to(Out.dtype.element_ty), mask=(g < G)[None, :])
    else:
        safe = tl.where(l_sum > 0, l_sum, 1.0)
        tl.store(Part + (row[None, :] * splits + s) * D + d[:, None], acc / safe[None, :], mask=(g < G)[None, :])
        tl.store(Lse + row * splits + s, tl.where(l_sum > 0, m + tl.log2(safe), float("-inf")), mask=g < G)


def decode(variant: str, q, k_cache, v_cache, indptr, indices, lens, sm_scale: float, splits: int,
           stages: int = 3, warps: int = 4, block_n: int = 128) -> torch.Tensor:  # fmt: skip
    rows, heads, dim = q.shape
    pages, page, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    out = torch.empty_like(q)
    part = lse = out
    if splits > 1:
        part = torch.empty(rows * heads * splits * dim, device=q.device, dtype=torch.float32)
        lse = torch.empty(rows * heads * splits, device=q.device, dtype=torch.float32)
    common = (q, k_cache, v_cache, indptr, indices, lens, out, part, lse, sm_scale * LOG2E)
    if variant in ("base", "dsum", "pv8"):
        {"base": _decode, "dsum": _decode_dsum, "pv8": _decode_pv8}[variant][(rows, kv_heads, splits)](
            *common, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), splits,
            G=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=dim, PAGE=page, BLOCK_N=block_n,
            SPLIT=splits > 1, num_warps=warps, num_stages=stages,
        )  # fmt: skip
    elif variant in ("allh", "allh-d"):
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and kv_heads & (kv_heads - 1) == 0
        tokens = min(page, max(1, block_n // kv_heads))
        _decode_allh[(rows, splits)](
            *common, q.stride(0), q.stride(1), k_cache.stride(0), splits,
            G=group, KVH=kv_heads, BLOCK_H=max(16, triton.next_power_of_2(heads)), D=dim, PAGE=page,
            TOKENS=tokens, SPLIT=splits > 1, DEFER=variant == "allh-d", num_warps=warps, num_stages=stages,
        )  # fmt: skip
    else:
        raise ValueError(f"unknown fp8 decode variant {variant!r}")
    if splits > 1:
        _merge[(rows * heads,)](out, part, lse, splits, D=dim, BLOCK_S=MERGE_BLOCK)
    return out
