"""Session 42: the embedded model's 121 block matrices (as the engine holds them) through two or more builds of
kernels/cpu_ops.c, one process, interleaved (order alternating), 40 passes at 1 row and 12 at more; medians, bests,
and whether each build's outputs equal the first's.

    PYTHONPATH=. python benchmarks/results/session42/cpu_prefetch/matmuls_prefetch_ab.py THREADS 1,4,16 before.c after.c
    (MARCH=haswell or MARCH=x86-64 builds for another instruction set)
"""

import ctypes
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from kernels.cpu_ops import QuantMatrix

rows_list = [int(r) for r in sys.argv[2].split(",")]
srcs = sys.argv[3:]
march = os.environ.get("MARCH", "native")
libs = []
for i, src in enumerate(srcs):
    so = f"/tmp/cpu_prefetch_ab_{i}.so"
    cmd = ["cc", "-O3", f"-march={march}", "-fopenmp", "-shared", "-fPIC", src, "-o", so, "-lm"]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(so)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.q4_1_matmul.argtypes = [p, i64, i64, p, p, p, i64, p]
    lib.q8_0_matmul.argtypes = [p, i64, i64, p, p, i64, p]
    libs.append(lib)

torch.set_num_threads(int(sys.argv[1]))
llm = LLM(EngineConfig())
qs: list[QuantMatrix] = []
for module in llm.engine.runner.model.modules():
    quant = getattr(module, "quant", None)
    if isinstance(quant, QuantMatrix):
        qs.append(quant)


def make_pass(
    lib: ctypes.CDLL, xs: dict[int, torch.Tensor], ys: dict[int, torch.Tensor], rows: int
) -> Callable[[], None]:
    def run() -> None:
        for q in qs:
            n, k = q.shape
            a, d, m = q._ptrs
            if m:
                lib.q4_1_matmul(xs[k].data_ptr(), rows, k, a, d, m, n, ys[n].data_ptr())
            else:
                lib.q8_0_matmul(xs[k].data_ptr(), rows, k, a, d, n, ys[n].data_ptr())

    return run


for rows in rows_list:
    xs = {q.shape[1]: torch.randn(rows, q.shape[1]) for q in qs}
    ys = [{q.shape[0]: torch.empty(rows, q.shape[0]) for q in qs} for _ in libs]
    passes = [make_pass(lib, xs, y, rows) for lib, y in zip(libs, ys)]
    times: list[list[float]] = [[] for _ in libs]
    for r in range(40 if rows == 1 else 12):
        order = list(range(len(libs)))
        for v in order if r % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            passes[v]()
            times[v].append(time.perf_counter() - t)
    base = statistics.median(times[0])
    for v, src in enumerate(srcs):
        same = all(torch.equal(ys[v][k], ys[0][k]) for k in ys[0])
        med = statistics.median(times[v])
        print(
            f"threads {sys.argv[1]} rows {rows:2d} {src:14s} median {med * 1e3:7.2f} ms"
            f"  best {min(times[v]) * 1e3:7.2f}"
            f"  ratio to first {base / med:.3f}  same: {same}",
            flush=True,
        )
