"""Session 40: the embedded model's block matmuls at one row (a decode step's weights), 1 and 2 threads.

PYTHONPATH=. python benchmarks/results/session40/cpu_ops_avx512/block_matmuls.py
"""

import time

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from kernels import cpu_ops
from kernels.cpu_ops import QuantMatrix

llm = LLM(EngineConfig())
qs: list[QuantMatrix] = []
for module in llm.engine.runner.model.modules():
    quant = getattr(module, "quant", None)
    if isinstance(quant, QuantMatrix):
        qs.append(quant)
print(len(qs), "quantized linears;", sorted({(q.kind, q.shape) for q in qs}))
for threads in (1, 2):
    torch.set_num_threads(threads)
    xs = {q.shape[1]: torch.randn(1, q.shape[1]) for q in qs}
    for _ in range(3):
        for q in qs:
            cpu_ops.matmul(xs[q.shape[1]], q)
    best = 1e9
    for _ in range(10):
        t0 = time.perf_counter()
        for q in qs:
            cpu_ops.matmul(xs[q.shape[1]], q)
        best = min(best, time.perf_counter() - t0)
    per: dict[str, float] = {}
    for q in qs:
        t0 = time.perf_counter()
        for _ in range(20):
            cpu_ops.matmul(xs[q.shape[1]], q)
        key = f"{q.kind}{q.shape}"
        per[key] = per.get(key, 0.0) + (time.perf_counter() - t0) / 20
    shapes = {k: f"{v * 1e3:.2f}" for k, v in per.items()}
    print(f"threads {threads}: all {len(qs)} matmuls at 1 row {best * 1e3:.2f} ms; ms by shape {shapes}")
llm.shutdown()
