"""Decode attention over a bf16 / fp16 paged KV pool in CUDA (kernels/cuda/paged_decode.cu), the FlashInfer backend's
decode where it runs (`supported`): Hopper, head dim 128, pages of 16 tokens, 2 or 4 query heads per KV head (the
kernel takes 1, 2 or 4; at 1 not measured).

It is built once per machine with the CUDA toolkit's nvcc (as FlashInfer's JIT builds its kernels) into the engine's
kernel cache (`load`), and called through ctypes on torch's current stream, so the decode CUDA graphs capture it. The
backend drives it through span_decode.SpanDecodeWrapper, the fp8 decode's planner: a request's keys in one span, or
cut into spans of one length when the batch is unbalanced, whose outputs the fp8 decode's merge kernel combines.

H200, Qwen3-0.6B's heads (16 query, 8 KV), one layer of the offline workload's lengths (pages in runs of 8, as the
engine allocates them), CUDA-graph replays (benchmarks/decode_attention_kernels.py, `cuda-ht-spans`; docs/gpu.md,
sixty-sixth session): 250.4-251.5 / 124.9 / 72.7-72.9 / 22.8 us at 256 / 128 / 64 / 16 rows with the products on the
tensor cores, against 256.8-257.9 / 127.8 / 77.7-77.9 / 24.7 on the CUDA cores and FlashInfer's tensor-core decode's
~271 / 141 / 81-82 / 24.5 (fifty-fifth to sixty-sixth sessions). At 256 rows it reads K/V at 4.45 TB/s, what its copies
alone reach (a streaming read: 4.51). Error against exact attention 2.1e-3 (1.7e-3 on the CUDA cores, FlashInfer's
2.1e-3). It is launched with programmatic dependent launch, as FlashInfer's attention is: the fused q/k/rope/KV kernel
before it lets it launch early (without, the engine lost the kernel's gain: docs/gpu.md, fifty-sixth session).
`MINISGL_CUDA_DECODE=0` turns it off (FlashInfer's decode then)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from kernels import cuda_build

SOURCE = Path(__file__).resolve().parent.parent / "cuda" / "paged_decode.cu"
# The engine's shape: warps per CTA, pipeline stages per warp, and how rows reach shared memory (2: cp.async.ca);
# paged_decode.cu builds only this one unless ALL_SHAPES is asked for (the benchmarks' other shapes).
WARPS, STAGES, COPY = 8, 2, 2
# The products (q.k and p.v) as 16x8x16 MMAs on the tensor cores rather than fp32 FMAs on the CUDA cores: one H200,
# Qwen3-0.6B's heads, offline lengths, 2.3-2.5% faster at 128-256 rows and 6.4-7.7% at 16-64 (docs/gpu.md,
# sixty-sixth session); p is rounded to the pool's 16 bits for them, as FlashInfer's tensor-core decode does (error
# against exact attention 2.1e-3, against 1.7e-3 on the CUDA cores). The engine's build has both.
TENSOR_CORES = True
ALL_SHAPES = ("-DPAGED_DECODE_ALL_SHAPES",)
HEAD_DIM, PAGE_SIZE, GROUPS = 128, 16, (1, 2, 4)
# The query heads per KV head the engine decodes through it: those measured faster than FlashInfer's decode on an
# H200. At 2 (Qwen3's 16/8) always; at 4 (Llama-3.1-8B's 32/8, and its 16/4 per rank under TP=2) since its products
# moved to the tensor cores: 5-12% faster at 32/8 and 16-256 rows, 2-11% at 16/4 and 32-256 rows, level at 16
# (benchmarks/results/session66/; on the CUDA cores it was 8-10% slower there, session57/). At 1 not measured.
ENGINE_GROUPS = (2, 4)
LOG2E = 1.4426950408889634

_libs: dict[tuple[str, ...], ctypes.CDLL] = {}


def enabled() -> bool:
    return os.environ.get("MINISGL_CUDA_DECODE", "1") != "0"


def supported(
    device: torch.device,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    sliding_window: int | None,
) -> bool:
    """Whether the engine decodes this pool through the kernel on this CUDA device: the shapes it is built for, a group
    of ENGINE_GROUPS, a 16-bit pool, no sliding window, Hopper (the GPUs it was measured on)."""
    return (
        torch.cuda.get_device_capability(device)[0] == 9
        and head_dim == HEAD_DIM
        and page_size == PAGE_SIZE
        and dtype in (torch.bfloat16, torch.float16)
        and sliding_window is None
        and num_heads % num_kv_heads == 0
        and num_heads // num_kv_heads in ENGINE_GROUPS
    )


def load(cache_dir: Path, device: torch.device | None = None, flags: tuple[str, ...] = ()) -> str | None:
    """Build (once per source, flags and GPU architecture, in `cache_dir`) and load the kernel; returns why it cannot
    run here, or None. On a CUDA device its kernels are loaded too: a toolkit newer than the driver builds a library
    that fails only at its first launch."""
    if flags in _libs:
        return None
    try:
        lib = cuda_build.build(SOURCE, cache_dir, device, flags)
    except RuntimeError as e:
        return str(e)
    lib.paged_decode_probe.restype = ctypes.c_char_p
    if device is not None and device.type == "cuda":  # a CPU device: built only (the tests that build it on CPUs)
        with torch.cuda.device(device):
            if why := lib.paged_decode_probe():
                return f"its kernels do not load on {torch.cuda.get_device_name(device)}: {why.decode()}"
    fn = lib.paged_decode_launch
    p, i64, i32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int
    fn.argtypes = [p] * 12 + [ctypes.c_float] + [i64] * 5 + [i32] * 9 + [p, i32, i32]
    fn.restype = i32
    _libs[flags] = lib
    return None


def decode(
    q: torch.Tensor,  # [rows, heads, 128], last dim contiguous, rows 16-byte aligned
    k_cache: torch.Tensor,  # [pages, 16, kv_heads, 128], q's dtype
    v_cache: torch.Tensor,
    indptr: torch.Tensor,  # int32 [rows + 1] into indices (device)
    indices: torch.Tensor,  # int32 page ids (device)
    work: torch.Tensor,  # int32 [3, items] (device): request (-1: none), first key, end key
    work_ptr: torch.Tensor,  # int32 [rows + 1] (device)
    sm_scale: float,
    part: torch.Tensor | None,  # fp32, at least items * heads * dim (None: no request has several spans)
    lse: torch.Tensor | None,  # fp32, at least items * heads
    out: torch.Tensor | None = None,  # contiguous [rows, heads, dim]
    *,
    counters: torch.Tensor | None = None,  # int32 [rows * kv_heads], zero: the spans merged inside the kernel
    order: torch.Tensor | None = None,  # int32 [items]: the item each CTA (group) takes
    warps: int = WARPS,
    stages: int = STAGES,
    copy: int = COPY,  # rows to shared memory by: 0 cp.async.cg, 1 the copy engine (bulk), 2 cp.async.ca, 3 ld + st
    flags: tuple[str, ...] = (),  # the build load() made (ALL_SHAPES for shapes other than the engine's)
    pdl: bool = True,  # launched with programmatic dependent launch: its launch overlaps the kernel before it
    heads_together: bool = False,  # a work item's KV heads in consecutive CTAs (a flat grid)
    tensor_cores: bool | None = None,  # the products on the tensor cores (None: TENSOR_CORES)
) -> torch.Tensor:
    from kernels.attention.fp8_decode import merge_spans  # Triton: on GPU machines only

    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q) if out is None else out
    if not (
        out.is_contiguous()
        and out.shape == q.shape
        and q.stride(2) == 1
        and q.data_ptr() % 16 == 0
        and q.stride(0) % 8 == 0
        and q.stride(1) % 8 == 0
        and work.stride(1) == 1
        and k_cache.stride() == v_cache.stride()
        and k_cache.shape == v_cache.shape
        and k_cache.stride(3) == 1
        and all(x % 8 == 0 for x in k_cache.stride()[:3])
        and k_cache.data_ptr() % 16 == 0
        and v_cache.data_ptr() % 16 == 0
        and work.dtype == work_ptr.dtype == indptr.dtype == indices.dtype == torch.int32
        and (dim, k_cache.shape[1]) == (HEAD_DIM, PAGE_SIZE)
        and q.dtype == k_cache.dtype == v_cache.dtype == out.dtype
        and (part is None) == (lse is None)
        and (part is None or part.dtype == lse.dtype == torch.float32)  # type: ignore[union-attr]
    ):
        raise ValueError(f"the CUDA decode cannot take q {tuple(q.shape)} {q.dtype} over K/V {tuple(k_cache.shape)}")
    tensor_cores = TENSOR_CORES if tensor_cores is None else tensor_cores
    lib = _libs.get(flags)
    if lib is None:
        raise RuntimeError("the CUDA decode is not built: call cuda_decode.load first")
    err = lib.paged_decode_launch(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        indptr.data_ptr(),
        indices.data_ptr(),
        work.data_ptr(),
        work_ptr.data_ptr(),
        None if order is None else order.data_ptr(),
        out.data_ptr(),
        None if part is None else part.data_ptr(),
        None if lse is None else lse.data_ptr(),
        None if part is None or counters is None else counters.data_ptr(),
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        work.stride(0),
        work.shape[1],
        heads,
        kv_heads,
        int(q.dtype == torch.float16),
        warps,
        stages,
        copy,
        int(pdl),
        torch.cuda.current_stream(q.device).cuda_stream,
        int(heads_together),
        int(tensor_cores),
    )
    if err == -1:
        raise ValueError(
            f"the CUDA decode's build {' '.join(flags) or 'for the engine'} has no kernel for {warps} warps, "
            f"{stages} stages, copy {copy}{' on the tensor cores' if tensor_cores else ''} and {heads // kv_heads} "
            "query heads per KV head"
        )
    if err:
        raise RuntimeError(f"paged_decode_launch: CUDA error {err} (rows {rows}, heads {heads}/{kv_heads}, dim {dim})")
    if part is not None and lse is not None and counters is None:
        merge_spans(out, part, lse, work_ptr, rows, heads)
    return out
