"""What the host CPU can do fast: the CPU default dtype is chosen here."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

# Overrides the CPU `auto` dtype (float32 | bfloat16); the test suite pins float32 so HF comparisons stay exact.
DTYPE_ENV = "MINISGL_CPU_DTYPE"
_CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def native_bf16() -> bool:
    """True when the CPU computes in bf16 natively (AVX512-BF16 or AMX). Without it, torch's bf16 matmuls
    convert element by element and ran 2-5x slower than fp32 on this project's AVX2 machine (docs/benchmarks.md)."""
    try:
        flags = _CPUINFO.read_text().split()
    except OSError:
        flags = []
    if flags:
        return "avx512_bf16" in flags or "amx_bf16" in flags
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def auto_dtype(gguf: bool = False) -> torch.dtype:
    """bf16 where the CPU has it natively (half the weight and KV traffic per token), else fp32. A GGUF model runs
    in fp32 everywhere: its linear layers read the file's 4- and 8-bit blocks (kernels/cpu_ops.py, fp32 only),
    fewer bytes than bf16 weights, with the dequantized model's fp32 results."""
    forced = os.environ.get(DTYPE_ENV)
    if forced:
        if forced not in ("float32", "bfloat16"):
            raise ValueError(f"{DTYPE_ENV} must be float32 or bfloat16 (got {forced!r})")
        return torch.bfloat16 if forced == "bfloat16" else torch.float32
    return torch.bfloat16 if native_bf16() and not gguf else torch.float32
