"""A decode attention kernel in CUDA over a bf16 / fp16 paged KV pool (benchmarks/paged_decode.cu), measured against
FlashInfer's in benchmarks/decode_attention_kernels.py (kernels `cuda*`; issue #17, thirty-first session). Not in the
engine: it ties FlashInfer's tensor-core decode on an H100 and trails it by 8-12% on an H200 at the offline workload's
batches, and on batches with one long request FlashInfer with a fixed split does as well (docs/gpu.md).

Built once per machine and GPU architecture with the CUDA toolkit's nvcc into the minisgl cache, and called through
ctypes on torch's current stream, so CUDA graphs capture it. It takes the fp8 Triton decode's work items (spans of
one length, fp8_decode_plan.fp8_decode_work) and its merge kernel for requests cut into several spans, or merges
them itself (`counters`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import cuda_lib  # this script's folder is on sys.path (decode_attention_kernels.py, run_gpu_cuda_decode.sh)
import numpy as np
import torch

SOURCE = Path(__file__).with_name("paged_decode.cu")
# the defaults; paged_decode.cu's by_shape lists the (warps, stages, copy) built, for head dim 128 and page 16 only
WARPS, STAGES = 4, 3

_lib: ctypes.CDLL | None = None


def library(device: torch.device | None = None) -> ctypes.CDLL:
    """The built kernel library, built first if this machine has none for this source and GPU architecture."""
    global _lib
    if _lib is not None:
        return _lib
    lib = cuda_lib.build(SOURCE, device)
    fn = lib.paged_decode_launch
    p, i64, i32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int
    fn.argtypes = [p] * 12 + [ctypes.c_float] + [i64] * 5 + [i32] * 8 + [p]
    fn.restype = i32
    _lib = lib
    return lib


def longest_first(work: np.ndarray) -> np.ndarray:
    """The order in which CTAs take the work items [3, items] (request, first key, end key): the longest first, so
    that no long read starts last and runs alone at the end; unused items (request -1) last."""
    length = np.where(work[0] >= 0, work[2] - work[1], -1)
    return np.argsort(-length, kind="stable").astype(np.int32)


def decode(
    q: torch.Tensor,  # [rows, heads, dim], last dim contiguous, rows 16-byte aligned
    k_cache: torch.Tensor,  # [pages, page, kv_heads, dim], q's dtype
    v_cache: torch.Tensor,
    indptr: torch.Tensor,  # int32 [rows + 1] into indices (device)
    indices: torch.Tensor,  # int32 page ids (device)
    work: torch.Tensor,  # int32 [3, items] (device): request (-1: none), first key, end key
    work_ptr: torch.Tensor,  # int32 [rows + 1] (device)
    sm_scale: float,
    part: torch.Tensor | None,  # fp32, at least items * heads * dim (None: no request has several spans)
    lse: torch.Tensor | None,  # fp32, at least items * heads
    out: torch.Tensor | None = None,  # contiguous [rows, heads, dim]
    counters: torch.Tensor | None = None,  # int32 [rows * kv_heads], zero: the spans merged inside the kernel
    order: torch.Tensor | None = None,  # int32 [items]: the item each CTA takes (longest_first)
    warps: int = WARPS,
    stages: int = STAGES,
    bulk: int = 0,  # rows to shared memory by: 0 cp.async.cg, 1 the copy engine (bulk), 2 cp.async.ca, 3 ld + st
) -> torch.Tensor:
    from kernels.attention.fp8_decode import LOG2E, merge_spans

    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q) if out is None else out
    assert out.is_contiguous() and q.stride(2) == 1 and work.stride(1) == 1 and k_cache.stride() == v_cache.stride()
    assert (part is None) == (lse is None)
    err = library().paged_decode_launch(
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
        bulk,
        torch.cuda.current_stream(q.device).cuda_stream,
    )
    if err:
        raise RuntimeError(f"paged_decode_launch: error {err} (rows {rows}, heads {heads}/{kv_heads}, dim {dim})")
    if part is not None and lse is not None and counters is None:
        merge_spans(out, part, lse, work_ptr, rows, heads)
    return out
