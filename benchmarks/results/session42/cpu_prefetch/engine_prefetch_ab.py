"""Session 42: the engine on the embedded model with two builds of kernels/cpu_ops.c swapped between runs (one
process, order alternating): one greedy stream of 128 tokens after a short chat prompt; 6 runs each, medians of the
decode rate.

    PYTHONPATH=. python benchmarks/results/session42/cpu_prefetch/engine_prefetch_ab.py before.c after.c THREADS
"""

import ctypes
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from kernels import cpu_ops

threads = int(sys.argv[3])
torch.set_num_threads(threads)
llm = LLM(EngineConfig(radix_cache=False))
libs: list[ctypes.CDLL | None] = []
for src in sys.argv[1:3]:
    cpu_ops._lib = None
    cpu_ops.SOURCE = Path(src)
    assert cpu_ops.load(Path(tempfile.mkdtemp())) is None
    libs.append(cpu_ops._lib)
ids = llm.encode([{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
sp = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
rate: dict[int, list[float]] = {0: [], 1: []}
tokens: dict[int, list[int]] = {}
for r in range(6):
    for v in (0, 1) if r % 2 == 0 else (1, 0):
        cpu_ops._lib = libs[v]
        out = llm.generate([ids], sp)[0]
        rate[v].append(1 / statistics.median(out.itls))
        tokens.setdefault(v, list(out.token_ids))
a, b = (statistics.median(rate[v]) for v in (0, 1))
runs = [[round(x, 1) for x in rate[v]] for v in (0, 1)]
print(
    f"threads {threads}, prompt {len(ids)} tokens: decode A {a:.1f} tok/s {runs[0]}"
    f"  B {b:.1f} tok/s {runs[1]}  B/A {b / a:.3f}"
)
print("same tokens:", tokens[0] == tokens[1])
llm.shutdown()
