"""Does Python's garbage collector stall the offline workload? (GPU, issue #17)

    source .whl/use-bundle.sh && python benchmarks/gc_offline_ab.py --out $OUT/gc_offline_ab.json

Runs bench-offline's default workload (256 requests, 133,966 output tokens) with LLM.generate's collector pause off
(`collector-on`) and on (`paused`, today's default), interleaved with the order alternating, and times every
collection through gc.callbacks: how many of each generation ran during the run, their total and their longest
pause. (A first version also tried freezing the heap out of the collector, as the serve loops do: no gain, since the
pauses are gen-0 passes over the step's young outputs; `benchmarks/results/throughput_h100/gc_offline_ab_3way.json`.)
H100 at this commit's change, 6 pairs (`gc_offline_ab.json`): collector-on ran one full collection of 137-201 ms in 4
of 6 runs, paused none; 18,632-19,587 tok/s (median 19,233) against 17,922-19,229 (median 19,032), paused ahead in 4
pairs and level in 2."""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections import defaultdict
from typing import Any

import torch

import engine.llm as llm_module
from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from minisgl_cli.bench_offline import OFFLINE_ENGINE
from minisgl_cli.workload import random_workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="gc_offline_ab.json")
    args = ap.parse_args()
    llm = LLM(EngineConfig(model=args.model, **OFFLINE_ENGINE))  # as bench-offline runs
    wl = random_workload(256, vocab_size=llm.engine.model_cfg.vocab_size)
    params = [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in wl.output_lens]
    llm.generate(wl.prompts[:32], [SamplingParams(max_tokens=16, temperature=0.6, ignore_eos=True)] * 32)

    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(on_gc)
    results: list[dict[str, Any]] = []
    modes = ["collector-on", "paused"]
    for rep in range(args.repeats):
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            llm_module.PAUSE_COLLECTOR = mode == "paused"
            llm.reset_prefix_cache()  # no gc.collect() here: bench-offline's runs follow each other without one
            pauses.clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs = llm.generate(wl.prompts, params)
            torch.cuda.synchronize()
            dur = time.perf_counter() - t0
            by_gen: dict[int, list[float]] = defaultdict(list)
            for g, p in pauses:
                by_gen[g].append(p * 1e3)
            tps = sum(len(o.token_ids) for o in outs) / dur
            collections = {g: dict(n=len(v), total_ms=sum(v), max_ms=max(v)) for g, v in sorted(by_gen.items())}
            results.append(dict(repeat=rep, mode=mode, output_throughput=tps, duration=dur, collections=collections))
            print(
                f"run {rep} {mode:<13}{tps:8.0f} tok/s {dur:6.3f} s  gc: "
                + ", ".join(
                    f"gen{g} x{c['n']} {c['total_ms']:.1f} ms (max {c['max_ms']:.1f})" for g, c in collections.items()
                ),
                flush=True,
            )
    gc.callbacks.remove(on_gc)
    for mode in modes:
        runs = sorted(float(r["output_throughput"]) for r in results if r["mode"] == mode)
        print(f"{mode:<13} median {runs[len(runs) // 2]:8.0f} tok/s  runs {[round(t) for t in runs]}")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": results}, f, indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
