"""A/B of the CPU weight layout (engine.layers.cpu_weight_layout): the embedded SmolLM2-135M, fp32, single-stream
greedy decode of 64 tokens, the layout toggled between runs in one process (normal [out, in] storage vs transposed
storage), interleaved --repeats times; medians. Prints and writes --json; asserts nothing.

    PYTHONPATH=. python benchmarks/cpu_weight_layout_ab.py --threads 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.layers import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear, VocabParallelEmbedding
from engine.llm import LLM
from engine.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(EngineConfig(device="cpu", dtype="float32"))
    kinds = (ColumnParallelLinear, RowParallelLinear, ReplicatedLinear, VocabParallelEmbedding)
    mods = [m for m in llm.engine.loaded.model.modules() if isinstance(m, kinds)]

    def layout(transposed: bool) -> None:
        for m in mods:
            w = m.weight.data
            m.weight.data = w.t().contiguous().t() if transposed else w.contiguous()

    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    prompt = list(range(100, 140))
    llm.generate([prompt], params)
    runs: dict[str, list[float]] = {"normal": [], "transposed": []}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.repeats):
        for name in runs:
            layout(name == "transposed")
            t = time.perf_counter()
            out = llm.generate([prompt], params)[0]
            runs[name].append(args.tokens / (time.perf_counter() - t))
            tokens[name] = list(out.token_ids)
    res = {
        "threads": args.threads,
        "tok_s": {k: statistics.median(v) for k, v in runs.items()},
        "runs": runs,
        "same_tokens": tokens["normal"] == tokens["transposed"],
    }
    for k, v in runs.items():
        print(f"{k:>10}: median {statistics.median(v):.1f} tok/s, runs {[round(x, 1) for x in v]}")
    ratio = res["tok_s"]["transposed"] / res["tok_s"]["normal"]
    print(f"transposed / normal: {ratio:.2f}x; same tokens: {res['same_tokens']}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
