"""Session 41: the engine on the embedded model with two builds of kernels/cpu_ops.c swapped under it between runs
(one process, order alternating): one greedy stream of 96 tokens and a batch of 16 prompts x 48 tokens, 4 runs each;
medians, and whether both builds gave the same tokens.

    PYTHONPATH=. python benchmarks/results/session41/cpu_block_weights/engine_ab.py \
        /tmp/before.c kernels/cpu_ops.c THREADS
"""

import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from kernels import cpu_ops

threads = int(sys.argv[3])
torch.set_num_threads(threads)
llm = LLM(EngineConfig())
libs: list[ctypes.CDLL | None] = []
for src in sys.argv[1:3]:
    cpu_ops._lib = None
    cpu_ops.SOURCE = Path(src)
    assert cpu_ops.load(Path(tempfile.mkdtemp())) is None
    libs.append(cpu_ops._lib)
ids = llm.encode([{"role": "user", "content": "Why is the sky blue?"}])
prompts = [llm.encode([{"role": "user", "content": f"Tell me fact number {i} about the ocean."}]) for i in range(16)]
one = SamplingParams(max_tokens=96, temperature=0, ignore_eos=True)
many = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
speed: dict[int, dict[str, list[float]]] = {v: {"single": [], "batch16": []} for v in (0, 1)}
tokens: dict[int, list[list[int]]] = {}
for r in range(4):
    for v in (0, 1) if r % 2 == 0 else (1, 0):
        cpu_ops._lib = libs[v]
        t = time.perf_counter()
        single = llm.generate([ids], one)[0]
        speed[v]["single"].append(96 / (time.perf_counter() - t))
        t = time.perf_counter()
        batch = llm.generate(prompts, many)
        speed[v]["batch16"].append(16 * 48 / (time.perf_counter() - t))
        tokens.setdefault(v, [list(o.token_ids) for o in [single, *batch]])
for kind in ("single", "batch16"):
    a, b = (statistics.median(speed[v][kind]) for v in (0, 1))
    runs = [[round(x, 1) for x in speed[v][kind]] for v in (0, 1)]
    print(f"threads {threads} {kind}: A {a:.1f} tok/s {runs[0]}  B {b:.1f} tok/s {runs[1]}  B/A {b / a:.3f}")
same = sum(x == y for x, y in zip(tokens[0], tokens[1]))
print(f"same tokens: {same} of 17 answers (the stream, then the batch's 16)")
llm.shutdown()
