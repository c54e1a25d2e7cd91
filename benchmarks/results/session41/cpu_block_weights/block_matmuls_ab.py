"""Session 41: the embedded model's 121 block matmuls through two builds of kernels/cpu_ops.c, interleaved in one
process (best of 15 passes at 1 row, 6 at 4 and 16 rows; 1 and 2 threads), and the largest relative difference of
their outputs.

    git show 467e071:kernels/cpu_ops.c > /tmp/before.c
    PYTHONPATH=. python benchmarks/results/session41/cpu_block_weights/block_matmuls_ab.py \
        /tmp/before.c kernels/cpu_ops.c
"""

import ctypes
import subprocess
import sys
import time

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from kernels.cpu_ops import QuantMatrix

srcs = sys.argv[1:3]
libs = []
for i, src in enumerate(srcs):
    so = f"/tmp/block_matmuls_ab_{i}.so"
    subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", src, "-o", so, "-lm"], check=True)
    lib = ctypes.CDLL(so)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.q4_1_matmul.argtypes = [p, i64, i64, p, p, p, i64, p]
    lib.q8_0_matmul.argtypes = [p, i64, i64, p, p, i64, p]
    libs.append(lib)

llm = LLM(EngineConfig())
qs: list[QuantMatrix] = []
for module in llm.engine.runner.model.modules():
    quant = getattr(module, "quant", None)
    if isinstance(quant, QuantMatrix):
        qs.append(quant)


def run(lib: ctypes.CDLL, xs: dict, ys: dict, rows: int) -> None:
    for q in qs:
        n, k = q.shape
        a, d, m = q._ptrs
        x, y = xs[k].data_ptr(), ys[n].data_ptr()
        if m:
            lib.q4_1_matmul(x, rows, k, a, d, m, n, y)
        else:
            lib.q8_0_matmul(x, rows, k, a, d, n, y)


for threads in (1, 2):
    torch.set_num_threads(threads)
    for rows in (1, 4, 16):
        xs = {q.shape[1]: torch.randn(rows, q.shape[1]) for q in qs}
        ys = {q.shape[0]: torch.empty(rows, q.shape[0]) for q in qs}
        best = [1e9, 1e9]
        for _ in range(15 if rows == 1 else 6):
            for v in (0, 1):
                t = time.perf_counter()
                run(libs[v], xs, ys, rows)
                best[v] = min(best[v], time.perf_counter() - t)
        outs = []
        for v in (0, 1):
            run(libs[v], xs, ys, rows)
            outs.append(torch.cat([y.flatten().clone() for y in ys.values()]))
        rel = ((outs[0] - outs[1]).abs().max() / outs[0].abs().max()).item()
        print(
            f"threads {threads} rows {rows}: {srcs[0]} {best[0] * 1e3:.2f} ms, {srcs[1]} {best[1] * 1e3:.2f} ms, "
            f"ratio {best[0] / best[1]:.3f}, max rel diff {rel:.1e}",
            flush=True,
        )
llm.shutdown()
