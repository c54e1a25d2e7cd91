"""Session 43: the engine on the embedded model with its decode steps replayed from recorded C calls
(engine/cpu_graph.py) and without (the runner's graphs taken away), one process, order alternating: one greedy
stream of N tokens after a chat prompt (short, or ~1,900 tokens); 6 runs each, medians of the decode rate.

    PYTHONPATH=. python benchmarks/results/session43/cpu_graphs/graphs_ab.py THREADS [short|long] [TOKENS]
"""

import statistics
import sys

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams

threads, kind = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "short"
n_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
torch.set_num_threads(threads)
llm = LLM(EngineConfig(radix_cache=False))
runner = llm.engine.runner
graphs = runner.graphs
assert graphs is not None
text = "Write a short story about a lighthouse keeper."
if kind == "long":
    line = "the keeper climbed the stairs and lit the lamp."
    text = "Summarize this text. " + " ".join(f"Line {i}: {line}" for i in range(130))
ids = llm.encode([{"role": "user", "content": text}])
sp = SamplingParams(max_tokens=n_tokens, temperature=0, ignore_eos=True)
rate: dict[str, list[float]] = {"eager": [], "graphs": []}
tokens: dict[str, list[int]] = {}
for r in range(6):
    for mode in ("eager", "graphs") if r % 2 == 0 else ("graphs", "eager"):
        runner.graphs = graphs if mode == "graphs" else None
        out = llm.generate([ids], sp)[0]
        rate[mode].append(1 / statistics.median(out.itls))
        tokens.setdefault(mode, list(out.token_ids))
a, b = (statistics.median(rate[m]) for m in ("eager", "graphs"))
runs = {m: [round(x, 1) for x in v] for m, v in rate.items()}
print(
    f"threads {threads}, prompt {len(ids)} tokens, {n_tokens} out: eager {a:.1f} tok/s {runs['eager']}"
    f"  graphs {b:.1f} tok/s {runs['graphs']}  ratio {b / a:.3f}  same tokens: {tokens['eager'] == tokens['graphs']}"
)
llm.shutdown()
