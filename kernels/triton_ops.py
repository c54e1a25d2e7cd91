"""Fused CUDA kernels (Triton) for the small per-token ops that otherwise cost a dozen kernel launches each:
RMSNorm (with the residual add), neox rotary embedding applied in place to q and k, and SiLU(gate) * up.
The torch versions in engine/layers.py stay the reference and the CPU path."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, x_stride, res_stride, out_stride, n, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        # The sum is rounded to the activation dtype first, as an unfused `x + residual` would be.
        x = x + tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * res_stride + cols, x, mask=mask)
        x = x.to(tl.float32)
    var = tl.sum(x * x, axis=0) / n
    # Round to the activation dtype before the weight multiply, as the HF reference does.
    y = (x * tl.rsqrt(var + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> torch.Tensor:
    """norm(x) or, with residual, residual += x (in place) and norm(residual). x: [..., n], last dim contiguous."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    res2 = residual.view(-1, n) if residual is not None else x2
    if x2.shape[0]:
        _rmsnorm_kernel[(x2.shape[0],)](
            x2,
            res2,
            weight,
            out,
            x2.stride(0),
            res2.stride(0),
            out.stride(0),
            n,
            eps,
            HAS_RES=residual is not None,
            BLOCK=triton.next_power_of_2(n),
        )
    return out.view(x.shape)


@triton.jit
def _inv_rms(x_ptr, row, stride, n, eps, BLOCK: tl.constexpr):
    """rsqrt(mean(x[row]^2) + eps) in fp32, BLOCK >= n: the factor RMSNorm scales a row by, for a norm folded into
    the GEMM after it (its weight in the GEMM's columns, engine/models/llama.py), which the kernel after that GEMM
    applies."""
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=0.0).to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)


@triton.jit
def _rope_heads(base, tok, tok_stride, head_stride, n_heads, cos, sin, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, HALF)[None, :]
    ptr = base + tok * tok_stride + h * head_stride + d
    mask = h < n_heads
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr, (x1 * cos - x2 * sin).to(base.dtype.element_ty), mask=mask)
    tl.store(ptr + HALF, (x2 * cos + x1 * sin).to(base.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    cs_ptr,
    pos_ptr,
    q_tok_stride,
    q_head_stride,
    k_tok_stride,
    k_head_stride,
    n_q_heads,
    n_k_heads,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    d = tl.arange(0, HALF)
    cos = tl.load(cs_ptr + pos * 2 * HALF + d)[None, :]
    sin = tl.load(cs_ptr + pos * 2 * HALF + HALF + d)[None, :]
    _rope_heads(q_ptr, tok, q_tok_stride, q_head_stride, n_q_heads, cos, sin, HALF, BLOCK_H)
    _rope_heads(k_ptr, tok, k_tok_stride, k_head_stride, n_k_heads, cos, sin, HALF, BLOCK_H)


def rope_inplace(q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor, pos: torch.Tensor) -> None:
    """q: [T, H, D], k: [T, KVH, D] (views into the qkv output are fine), cos_sin: [max_pos, D] fp32."""
    T, H, D = q.shape
    if T:
        _rope_kernel[(T,)](
            q,
            k,
            cos_sin,
            pos,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            H,
            k.shape[1],
            HALF=D // 2,
            BLOCK_H=triton.next_power_of_2(max(H, k.shape[1])),
        )


@triton.jit
def _silu_mul_kernel(
    x_ptr,
    out_ptr,
    n,
    x_stride,
    out_stride,
    h_ptr,
    h_stride,
    h_n,
    eps,
    SCALED: tl.constexpr,
    BLOCK: tl.constexpr,
    H_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + n + cols, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        inv = _inv_rms(h_ptr, row, h_stride, h_n, eps, H_BLOCK)
        gate, up = gate * inv, up * inv
    y = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32) * up
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, norm_of: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """[T, 2I] (gate | up) -> silu(gate) * up, [T, I]. With `norm_of` ([T, H]), x is the projection of those rows
    unnormalized (an RMSNorm's weight folded into its columns): gate and up are first scaled by each row's
    rsqrt(mean(norm_of^2) + eps), which makes them the projection of the normalized rows."""
    T, two_i = x.shape
    n = two_i // 2
    out = torch.empty((T, n), dtype=x.dtype, device=x.device)
    h = norm_of if norm_of is not None else x
    assert h.stride(-1) == 1 and h.shape[0] == T, "norm_of: one row per token, its last dim contiguous"
    if T:
        block = 1024
        _silu_mul_kernel[(T, triton.cdiv(n, block))](
            x,
            out,
            n,
            x.stride(0),
            out.stride(0),
            h,
            h.stride(0),
            h.shape[1],
            eps,
            SCALED=norm_of is not None,
            BLOCK=block,
            H_BLOCK=triton.next_power_of_2(h.shape[1]) if norm_of is not None else 1,
        )
    return out


@triton.jit
def _mix32(x):
    """A bijective 32-bit avalanche mix (C. Wellons' lowbias32); products are cut back to 32 bits."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D).to(tl.uint32)
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B).to(tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _lg2(x):
    """log2 on the special-function unit: one instruction, absolute error about 2^-22."""
    return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _gumbel(seed, cols):
    """Gumbel noise -ln(-ln u) for each (seed, column), u uniform in (0, 1) from 24 bits of the column's index under
    a key mixed from the seed, mixed again (about a tenth of the integer work of tl.rand's Philox). Both logs run on
    the special-function unit; -ln u near u = 1, where the largest noise (the likely winner) comes from, is a series
    in 1 - u, exact from the integer, since log2 of u itself has only absolute accuracy there. Against the same
    noise in float64 this draws the exact token in 10,240 of 10,240 rows; tl.log, at twice the time, in 10,163
    (benchmarks/sampler_rng.py)."""
    key = _mix32(seed.to(tl.uint32))
    h = _mix32(((cols.to(tl.uint32) * 0x9E3779B9).to(tl.uint32)) ^ key) >> 8
    u = (h.to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    w = ((16777215 - h).to(tl.float32) + 0.5) * (1.0 / 16777216.0)  # 1 - u
    series = w * (1.0 + w * (0.5 + w * (0.3333333333 + w * (0.25 + w * 0.2))))  # -ln(1 - w), w < 1/16
    e = tl.where(w < 0.0625, series, -0.6931471805599453 * _lg2(u))
    return -0.6931471805599453 * _lg2(e)


@triton.jit
def _sample_kernel(logits_ptr, stride, V, temp_ptr, seed_ptr, val_ptr, idx_ptr, n_chunks, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    seed = tl.load(seed_ptr + row)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    x = tl.load(logits_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    if temp > 0:
        x = x * (1.0 / temp) + _gumbel(seed, cols)  # Gumbel-max: the argmax is a draw from softmax(x / temp)
    x = tl.where(mask, x, -float("inf"))
    best, at = tl.max(x, axis=0, return_indices=True)
    tl.store(val_ptr + row * n_chunks + chunk, best)
    tl.store(idx_ptr + row * n_chunks + chunk, at + chunk * BLOCK)


def sample_gumbel(
    logits: torch.Tensor, temps: torch.Tensor, seeds: torch.Tensor, block: int = 2048, num_warps: int = 4
) -> torch.Tensor:
    """Greedy where temp == 0, else a draw from softmax(logits / temp) whose noise is a pure function of the
    row's seed (so a seeded request samples the same tokens in any batch). Each row is cut into chunks of `block`
    columns that run in parallel; a small argmax over the chunk winners finishes the job (the first maximum wins
    at every level, so the result does not depend on `block`)."""
    B, V = logits.shape
    n_chunks = triton.cdiv(V, block)
    vals = torch.empty((B, n_chunks), dtype=torch.float32, device=logits.device)
    idx = torch.empty((B, n_chunks), dtype=torch.int64, device=logits.device)
    if B:
        _sample_kernel[(B, n_chunks)](
            logits, logits.stride(0), V, temps, seeds, vals, idx, n_chunks, BLOCK=block, num_warps=num_warps
        )
    return idx.gather(1, vals.argmax(1, keepdim=True)).squeeze(1)


@triton.jit
def _to_cache(x, ct: tl.constexpr):
    """A K/V row as the pool stores it: the activation dtype as is; fp8 (e4m3, scale 1) saturated at +-448 as
    KVPool.store does."""
    if ct.primitive_bitwidth == 8:
        return tl.clamp(x.to(tl.float32), -448.0, 448.0).to(ct)
    return x.to(ct)


@triton.jit
def _qk_rows(
    ptr,
    tok,
    tok_stride,
    head_stride,
    n_heads,
    w_ptr,
    eps,
    cos,
    sin,
    cache_ptr,
    slot,
    inv,
    b_ptr,
    HAS_NORM: tl.constexpr,
    SCALED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    STORE: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Per-head RMSNorm (optional) then neox rope of one token's heads, in place; also into the cache row. SCALED:
    the rows are first scaled by `inv` (a folded input norm's factor) and the bias added, rounded as a GEMM's
    output would be."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, HALF)[None, :]
    mask = h < n_heads
    p = ptr + tok * tok_stride + h * head_stride + d
    dt = ptr.dtype.element_ty
    x1 = tl.load(p, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p + HALF, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        x1, x2 = x1 * inv, x2 * inv
        if HAS_BIAS:
            x1 += tl.load(b_ptr + h * 2 * HALF + d, mask=mask, other=0.0).to(tl.float32)
            x2 += tl.load(b_ptr + h * 2 * HALF + HALF + d, mask=mask, other=0.0).to(tl.float32)
        x1, x2 = x1.to(dt).to(tl.float32), x2.to(dt).to(tl.float32)
    if HAS_NORM:  # rounded where the unfused RMSNorm rounds: before and after the weight multiply
        inv = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + d).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + d).to(tl.float32)
        x1 = ((x1 * inv).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
        x2 = ((x2 * inv).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    y1 = (x1 * cos - x2 * sin).to(dt)
    y2 = (x2 * cos + x1 * sin).to(dt)
    tl.store(p, y1, mask=mask)
    tl.store(p + HALF, y2, mask=mask)
    if STORE:
        c = cache_ptr + slot * n_heads * 2 * HALF + h * 2 * HALF + d
        ct = cache_ptr.dtype.element_ty
        tl.store(c, _to_cache(y1, ct), mask=mask)
        tl.store(c + HALF, _to_cache(y2, ct), mask=mask)


@functools.cache
def _launch_dependents(device: torch.device) -> bool:
    """Programmatic dependent launch (Hopper on): the fused kernel lets the next kernel launch at its start. The next
    is FlashInfer's attention, launched with PDL, which waits at its own start until this kernel's writes (q, and
    K/V in the pool) are visible, so only its launch overlaps this kernel. Issue #17's offline run on one H200, three
    interleaved pairs of --runs 3: 25,884-25,925 tok/s against 25,599-25,677 (+1.0%; benchmarks/results/session41/
    h200_qkv_pdl/). A kernel after this one launched without PDL waits for it to finish, as before."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def _qkv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    eps,
    cs_ptr,
    pos_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    q_tok_stride,
    q_head_stride,
    k_tok_stride,
    k_head_stride,
    v_tok_stride,
    v_head_stride,
    n_q_heads,
    n_kv_heads,
    h_ptr,
    h_stride,
    h_n,
    h_eps,
    qb_ptr,
    kb_ptr,
    vb_ptr,
    HAS_NORM: tl.constexpr,
    SCALED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    H_BLOCK: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr,
):
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    d = tl.arange(0, HALF)
    cos = tl.load(cs_ptr + pos * 2 * HALF + d)[None, :]
    sin = tl.load(cs_ptr + pos * 2 * HALF + HALF + d)[None, :]
    inv = 1.0
    if SCALED:
        inv = _inv_rms(h_ptr, tok, h_stride, h_n, h_eps, H_BLOCK)
    _qk_rows(
        q_ptr,
        tok,
        q_tok_stride,
        q_head_stride,
        n_q_heads,
        qw_ptr,
        eps,
        cos,
        sin,
        kc_ptr,
        slot,
        inv,
        qb_ptr,
        HAS_NORM,
        SCALED,
        HAS_BIAS,
        False,
        HALF,
        BLOCK_Q,
    )
    _qk_rows(
        k_ptr,
        tok,
        k_tok_stride,
        k_head_stride,
        n_kv_heads,
        kw_ptr,
        eps,
        cos,
        sin,
        kc_ptr,
        slot,
        inv,
        kb_ptr,
        HAS_NORM,
        SCALED,
        HAS_BIAS,
        True,
        HALF,
        BLOCK_KV,
    )
    h = tl.arange(0, BLOCK_KV)[:, None]
    dd = tl.arange(0, 2 * HALF)[None, :]
    mask = h < n_kv_heads
    v = tl.load(v_ptr + tok * v_tok_stride + h * v_head_stride + dd, mask=mask)
    if SCALED:  # in place too: a prefill's attention may read the new rows' V from here rather than the pool
        vf = v.to(tl.float32) * inv
        if HAS_BIAS:
            vf += tl.load(vb_ptr + h * 2 * HALF + dd, mask=mask, other=0.0).to(tl.float32)
        v = vf.to(v_ptr.dtype.element_ty)
        tl.store(v_ptr + tok * v_tok_stride + h * v_head_stride + dd, v, mask=mask)
    vc = vc_ptr + slot * n_kv_heads * 2 * HALF + h * 2 * HALF + dd
    tl.store(vc, _to_cache(v, vc_ptr.dtype.element_ty), mask=mask)


def qk_norm_rope_store(
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
) -> None:
    """One launch per layer for what is otherwise four to six: per-head RMSNorm of q and k (Qwen3; skipped when
    the weights are None), neox rope on both (in place), and the K/V store into the paged pool at flat `slots`.
    q: [T, H, D], k/v: [T, KVH, D] (views into the qkv output are fine); caches contiguous [pages, page, KVH, D].
    With `norm_of` ([T, hidden]), q/k/v are the projection of those rows unnormalized (the input RMSNorm's weight
    folded into its columns): each token's q, k and v are first scaled by rsqrt(mean(norm_of^2) + norm_eps), then
    `bias` (q | k | v, [(H + 2 KVH) D]) is added, and v is written back in place as well."""
    T, H, D = q.shape
    KVH = k.shape[1]
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[-2:] == (KVH, D)
    assert bias is None or norm_of is not None, "a bias is added here only after a folded norm's scale"
    assert norm_of is None or (norm_of.stride(-1) == 1 and norm_of.shape[0] == T), "norm_of: a row per token"
    if not T:
        return
    has_norm = q_weight is not None and k_weight is not None
    h = norm_of if norm_of is not None else q
    b = bias if bias is not None else q
    qb, kb, vb = (b, b[H * D :], b[(H + KVH) * D :]) if bias is not None else (b, b, b)
    _qkv_kernel[(T,)](
        q,
        k,
        v,
        q_weight if has_norm else q,
        k_weight if has_norm else k,
        eps,
        cos_sin,
        pos,
        k_cache,
        v_cache,
        slots,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        H,
        KVH,
        h,
        h.stride(0),
        h.shape[-1] if norm_of is not None else 0,
        norm_eps,
        qb,
        kb,
        vb,
        HAS_NORM=has_norm,
        SCALED=norm_of is not None,
        HAS_BIAS=bias is not None,
        HALF=D // 2,
        BLOCK_Q=triton.next_power_of_2(H),
        BLOCK_KV=triton.next_power_of_2(KVH),
        H_BLOCK=triton.next_power_of_2(h.shape[-1]) if norm_of is not None else 1,
        LAUNCH_DEPENDENTS=_launch_dependents(q.device),
    )
