"""Session 41: the engine on the embedded model with two builds of kernels/cpu_ops.c swapped under it between runs
(one process, order alternating): one greedy stream of 64 tokens after a ~1,700-token prompt, where each decode step
attends over ~1,700 tokens in each of the 30 layers; 4 runs each, medians of the decode rate (the prefill excluded),
and whether both builds gave the same tokens.

    PYTHONPATH=. python benchmarks/results/session41/cpu_decode_attention/engine_long_ab.py \
        /tmp/before_attn.c kernels/cpu_ops.c THREADS  # git show 8dc0d9e:kernels/cpu_ops.c > /tmp/before_attn.c
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
text = " ".join(f"Note {i}: the tide rose at dawn and the boats left the harbour before noon." for i in range(100))
ids = llm.encode([{"role": "user", "content": text + " Summarize the notes."}])
sp = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
rate: dict[int, list[float]] = {0: [], 1: []}
tokens: dict[int, list[int]] = {}
for r in range(4):
    for v in (0, 1) if r % 2 == 0 else (1, 0):
        cpu_ops._lib = libs[v]
        out = llm.generate([ids], sp)[0]
        rate[v].append(1 / statistics.median(out.itls))
        tokens.setdefault(v, list(out.token_ids))
a, b = (statistics.median(rate[v]) for v in (0, 1))
runs = [[round(x, 1) for x in rate[v]] for v in (0, 1)]
print(f"threads {threads}, prompt {len(ids)} tokens: decode A {a:.1f} tok/s {runs[0]}", end="  ")
print(f"B {b:.1f} tok/s {runs[1]}  B/A {b / a:.3f}")
print("same tokens:", tokens[0] == tokens[1])
llm.shutdown()
