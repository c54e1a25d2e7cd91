"""Session 43: silu_mul_f32 of two builds of kernels/cpu_ops.c at one row of SmolLM2's width, in one process,
interleaved (300 calls x 20 rounds each; the time per call includes Python's ~10 us).

    PYTHONPATH=. python benchmarks/results/session43/cpu_silu/silu_kernel_ab.py before.c after.c THREADS
"""

import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kernels import cpu_ops

torch.set_num_threads(int(sys.argv[3]))
libs: list[ctypes.CDLL | None] = []
for src in sys.argv[1:3]:
    cpu_ops._lib = None
    cpu_ops.SOURCE = Path(src)
    assert cpu_ops.load(Path(tempfile.mkdtemp())) is None
    libs.append(cpu_ops._lib)
x = torch.randn(1, 3072) * 3
us: dict[int, list[float]] = {0: [], 1: []}
outs: dict[int, torch.Tensor] = {}
for _ in range(20):
    for v in (0, 1):
        cpu_ops._lib = libs[v]
        t = time.perf_counter()
        for _ in range(300):
            outs[v] = cpu_ops.silu_and_mul(x)
        us[v].append((time.perf_counter() - t) / 300 * 1e6)
diff = ((outs[0] - outs[1]).abs() / outs[0].abs().clamp_min(1e-30)).max()
before, after = (statistics.median(us[v]) for v in (0, 1))
print(f"silu_and_mul 1 x 1536: before {before:.2f} us, after {after:.2f} us per call; max rel diff {diff:.2e}")
