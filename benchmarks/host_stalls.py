"""Where the host falls behind the GPU in an offline run, step by step (issue #17; GPU):

    source .whl/use-bundle.sh && python benchmarks/host_stalls.py --out $OUT/host_stalls.json

bench-offline's default workload on dummy Qwen3-0.6B as bench-offline runs it (token ids only, final outputs only),
with the engine's step records on. Under overlap scheduling a step launches batch N+1 and then waits for batch N's
tokens: a wait of ~0 means the GPU had finished N before the host got there, so it idled. Per step: the host's
schedule / launch / process milliseconds, the wait, the batch, and how many pinned host blocks torch allocated
(cudaHostAlloc, slow) during it. Prints the distribution and the slowest steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from minisgl_cli.bench_offline import OFFLINE_ENGINE
from minisgl_cli.workload import random_workload, warmup_like


def host_allocs() -> int:
    stats = (
        torch.cuda.host_memory_stats() if torch.cuda.is_available() and hasattr(torch.cuda, "host_memory_stats") else {}
    )
    return int(stats.get("num_host_alloc", stats.get("allocations.current", 0)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default="host_stalls.json")
    args = ap.parse_args()
    llm = LLM(EngineConfig(model=args.model, **OFFLINE_ENGINE))  # as bench-offline runs
    engine = llm.engine
    wl = random_workload(256, vocab_size=engine.model_cfg.vocab_size)
    params = [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True, detokenize=False) for n in wl.output_lens]
    other = warmup_like(wl, engine.model_cfg.vocab_size)
    llm.generate(other.prompts, SamplingParams(max_tokens=8, temperature=0.6, ignore_eos=True))
    llm.generate(wl.prompts, params, on_progress=lambda *_: None)  # a fresh GPU runs slower for its first ~30 s

    allocs: list[int] = []
    phases: list[dict[str, float]] = []  # per step: wall and thread-CPU ms of each timed part
    current: dict[str, float] = defaultdict(float)
    step = engine._step

    def counted_step():  # pinned blocks allocated during each step
        before = host_allocs()
        w, c = time.perf_counter(), time.thread_time()
        out = step()
        current["step_wall"] += (time.perf_counter() - w) * 1e3
        current["step_cpu"] += (time.thread_time() - c) * 1e3
        allocs.append(host_allocs() - before)
        phases.append(dict(current))
        current.clear()
        return out

    def timed(obj, name: str, label: str) -> None:
        """Time obj.name on every call: wall ms and this thread's CPU ms (less CPU than wall: the thread was
        blocked or descheduled, not computing)."""
        fn = getattr(obj, name)

        def wrapper(*a, **k):
            w, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                current[label + "_wall"] += (time.perf_counter() - w) * 1e3
                current[label + "_cpu"] += (time.thread_time() - c) * 1e3

        setattr(obj, name, wrapper)

    runner = engine.runner
    timed(runner, "run", "launch")
    if runner.graphs is not None and runner.graphs.enabled:
        timed(runner.backend.decode_backend(), "plan_graph", "plan")
        timed(torch.cuda.CUDAGraph, "replay", "replay")
    timed(runner.model, "logits", "logits")
    timed(runner.sampler, "sample", "sample")
    timed(runner, "_output", "output")
    timed(runner, "kv_layout", "kv_layout")

    engine._step = counted_step  # type: ignore[method-assign]
    results = []
    for run in range(args.runs):
        llm.reset_prefix_cache()  # applied now, not at the run's first step
        engine.step_records = []
        allocs.clear()
        phases.clear()
        llm.generate(wl.prompts, params, on_progress=lambda *_: None)
        recs = engine.step_records
        engine.step_records = None
        # record i is the step that processed batch i and launched batch i + 1; allocs has one more entry per
        # step that processed nothing (the first)
        al = allocs[len(allocs) - len(recs) :]
        ph = phases[len(phases) - len(recs) :]
        rows = [
            dict(
                i=i,
                rows=r.decode_rows + r.prefill_rows,
                prefill_tokens=r.prefill_tokens,
                schedule_ms=r.schedule_ms,
                launch_ms=r.launch_ms,
                wait_ms=r.wait_ms,
                process_ms=r.process_ms,
                host_ms=r.schedule_ms + r.launch_ms + r.process_ms,
                pinned_allocs=a,
                **p,
            )
            for i, (r, a, p) in enumerate(zip(recs, al, ph))
        ]
        dry = [r for r in rows if r["wait_ms"] < 0.05 and r["i"] > 20]
        summary = {
            "steps": len(rows),
            "wall_s": recs[-1].t - recs[0].t,
            "host_ms_median": statistics.median(r["host_ms"] for r in rows),
            "host_ms_p99": sorted(r["host_ms"] for r in rows)[int(0.99 * len(rows))],
            "wait_ms_sum": sum(r["wait_ms"] for r in rows),
            "steps_gpu_ran_dry": len(dry),
            "host_ms_in_dry_steps": sum(r["host_ms"] for r in dry),
            "pinned_allocs": sum(al),
            "by_phase_ms": {k: sum(r[k] for r in rows) for k in ("schedule_ms", "launch_ms", "process_ms")},
        }
        print(f"run {run}:", {k: round(v, 2) if isinstance(v, float) else v for k, v in summary.items()})
        decode = [r for r in rows if r["prefill_tokens"] == 0]
        medians = {k: statistics.median(r.get(k, 0.0) for r in decode) for k in ph[-1]}
        summary["decode_median_ms"] = medians
        print("  decode steps, median ms:", {k: round(v, 3) for k, v in medians.items()})
        for r in sorted(decode, key=lambda r: -r["host_ms"])[:12]:
            print("  slow step", {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()})
        results.append(dict(summary=summary, steps=rows))
    with open(args.out, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", runs=results), f)
    llm.shutdown()


if __name__ == "__main__":
    main()
