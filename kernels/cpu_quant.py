"""Linear layers on a CPU straight from GGUF's quantized blocks (Q4_1, Q8_0), fp32 activations and accumulation.

The embedded SmolLM2 ships as Q4_1 (its embedding/LM head as Q8_0): 98 MB, against 540 MB dequantized to fp32. A
decode step reads every weight once, so on a CPU its matmuls are bound by memory traffic; reading the blocks as
stored moves 5-8.5 bits a weight instead of 32. The products are the dequantized model's to fp32 rounding (the
weights are exact: d * q + m of the file's values), not a new approximation: activations are never quantized.

The kernel is C (kernels/cpu_quant.c), built once per machine with the system's C compiler (`cc`, or $CC) into a
cache directory the caller names (`load`) and called through ctypes; where it cannot be built the engine keeps its
dense fp32 matmuls and says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

SOURCE = Path(__file__).with_name("cpu_quant.c")
QK = 32  # weights per block
# bytes per block: Q4_1 = fp16 d, fp16 m, 16 bytes of nibbles; Q8_0 = fp16 d, 32 int8
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


@dataclass(frozen=True)
class QuantMatrix:
    """A [out_features, in_features] weight as blocks of 32 along in_features: quants `qs` (Q4_1: [N, K / 2] uint8
    of nibbles in ggml's order; Q8_0: [N, K] int8), per-block scale `d` and (Q4_1) minimum `m`, fp32 [N, K / 32]."""

    kind: str
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None
    shape: tuple[int, int] = field(init=False)
    # (qs, d, m) addresses for the kernel: a decode step makes ~120 of these calls, each Python step counts
    _ptrs: tuple[int, int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n, width = self.qs.shape
        if not (self.qs.is_contiguous() and self.d.is_contiguous() and (self.m is None or self.m.is_contiguous())):
            raise ValueError("quantized blocks must be contiguous")
        object.__setattr__(self, "shape", (n, width * (2 if self.kind == "Q4_1" else 1)))
        m_ptr = 0 if self.m is None else self.m.data_ptr()
        object.__setattr__(self, "_ptrs", (self.qs.data_ptr(), self.d.data_ptr(), m_ptr))

    @staticmethod
    def from_gguf(kind: str, raw: np.ndarray, out_features: int, in_features: int) -> QuantMatrix:
        """From a GGUF tensor's raw bytes (rows of blocks, as gguf.GGUFReader hands them out)."""
        if kind not in BLOCK_BYTES or in_features % QK:
            raise ValueError(f"no CPU kernel for {kind} with {in_features} inputs")
        blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(out_features, in_features // QK, BLOCK_BYTES[kind])
        d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
        if kind == "Q4_1":
            m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
            qs = torch.from_numpy(blocks[..., 4:].reshape(out_features, -1).copy())
            return QuantMatrix(kind, qs, d, m)
        qs = torch.from_numpy(blocks[..., 2:].reshape(out_features, -1).copy().view(np.int8))
        return QuantMatrix(kind, qs, d, None)

    def rows(self, index: torch.Tensor) -> QuantMatrix:
        """These output rows, in this order (llama.cpp's q/k row permutation, a tensor-parallel shard)."""
        m = None if self.m is None else self.m[index].contiguous()
        return QuantMatrix(self.kind, self.qs[index].contiguous(), self.d[index].contiguous(), m)

    @staticmethod
    def cat(parts: list[QuantMatrix]) -> QuantMatrix:
        """Stacked output rows (q|k|v, gate|up), as the engine packs them."""
        kinds = {p.kind for p in parts}
        if len(kinds) != 1 or len({p.shape[1] for p in parts}) != 1:
            raise ValueError(f"cannot stack {[(p.kind, p.shape) for p in parts]}")
        m = None if parts[0].m is None else torch.cat([p.m for p in parts if p.m is not None])
        return QuantMatrix(parts[0].kind, torch.cat([p.qs for p in parts]), torch.cat([p.d for p in parts]), m)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight, as gguf's own dequantization gives it (for tests)."""
        n, k = self.shape
        if self.kind == "Q4_1":
            b = self.qs.reshape(n, k // QK, 16)
            q = torch.cat([b & 0x0F, b >> 4], dim=-1).float()
            assert self.m is not None
            return (self.d.unsqueeze(-1) * q + self.m.unsqueeze(-1)).reshape(n, k)
        return (self.d.unsqueeze(-1) * self.qs.reshape(n, k // QK, QK).float()).reshape(n, k)

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        out = {f"{prefix}.qs": self.qs, f"{prefix}.d": self.d}
        if self.m is not None:
            out[f"{prefix}.m"] = self.m
        return out

    @staticmethod
    def from_tensors(kind: str, prefix: str, t: dict[str, torch.Tensor]) -> QuantMatrix:
        return QuantMatrix(kind, t[f"{prefix}.qs"], t[f"{prefix}.d"], t.get(f"{prefix}.m"))


_lib: ctypes.CDLL | None = None


def load(cache_dir: Path) -> str | None:
    """Build (once per source, compiler and CPU) and load the kernel; returns why it cannot run here, or None."""
    global _lib
    if _lib is not None:
        return None
    if os.environ.get("MINISGL_CPU_QUANT", "1") == "0":
        return "turned off by MINISGL_CPU_QUANT=0"
    try:
        lib = ctypes.CDLL(str(_build(cache_dir)))
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        detail = getattr(e, "stderr", None) or e
        return f"cannot build {SOURCE.name} with the C compiler: {str(detail).strip()[:300]}"
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.q4_1_matmul.argtypes = [p, i64, i64, p, p, p, i64, p]
    lib.q8_0_matmul.argtypes = [p, i64, i64, p, p, i64, p]
    lib.q4_1_matmul.restype = lib.q8_0_matmul.restype = None
    _lib = lib
    return None


def matmul(x: torch.Tensor, w: QuantMatrix) -> torch.Tensor:
    """x [..., K] float32 @ w^T -> [..., N] float32."""
    lib = _lib
    assert lib is not None, "load() the kernel first"
    n, k = w.shape
    x2 = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, k).contiguous()
    if x2.dtype != torch.float32 or x2.shape[1] != k:
        raise ValueError(f"the quantized CPU matmul takes float32 [M, {k}] activations, got {x2.dtype} {list(x.shape)}")
    y = torch.empty((x2.shape[0], n))
    qs, d, m = w._ptrs
    if m:
        lib.q4_1_matmul(x2.data_ptr(), x2.shape[0], k, qs, d, m, n, y.data_ptr())
    else:
        lib.q8_0_matmul(x2.data_ptr(), x2.shape[0], k, qs, d, n, y.data_ptr())
    return y if x2 is x else y.reshape(*x.shape[:-1], n)


def _build(cache_dir: Path) -> Path:
    """The shared library for this source, compiler and CPU, built on first use (a second or two) and kept."""
    cc = os.environ.get("CC", "cc")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), cc, version, " ".join(_FLAGS), _cpu_flags(), platform.machine()]).encode()
    ).hexdigest()[:16]
    out = cache_dir / f"cpu_quant-{key}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        subprocess.run(
            [cc, *_FLAGS, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True, check=True, timeout=120
        )
        tmp.replace(out)  # another process building the same key writes the same bytes
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return sys.platform
