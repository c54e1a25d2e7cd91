"""Where the idle time between a decode step's kernels goes (issue #17; GPU):

    source .whl/use-bundle.sh && python benchmarks/kernel_gaps.py --out $OUT/kernel_gaps.json

Runs 256 requests of dummy Qwen3-0.6B (prompts of 512 tokens, 64 output tokens) under torch.profiler, takes the
CUDA-graph decode steps at full batch, and sums the time between one kernel's end and the next kernel's start by the
pair of kernel kinds (the kinds of benchmarks/step_profile.py). The sum of a step's kernel times falls short of the
step's GPU time by these gaps.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict

import torch
from step_profile import KERNEL_KINDS  # this script's folder is on sys.path when run as a script

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams


def kind(name: str) -> str:
    return next((c for c, rx in KERNEL_KINDS if re.search(rx, name)), "other")


def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--out", default="kernel_gaps.json")
    args = ap.parse_args()
    llm = LLM(EngineConfig(model=args.model))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 10000, (512,), generator=g).tolist() for _ in range(256)]
    params = SamplingParams(max_tokens=64, temperature=0.6, ignore_eos=True)
    llm.generate(prompts[:16], params)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, params)
        torch.cuda.synchronize()
    kernels = sorted(
        (
            e
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.name and "Memcpy" not in e.name
        ),
        key=lambda e: e.time_range.start,
    )
    # a decode step at full batch: the kernels between two sampler kernels, after the prefill steps are done
    samples = [i for i, e in enumerate(kernels) if kind(e.name) == "sampler" and "_sample_kernel" in e.name]
    gaps: dict[str, list[float]] = defaultdict(list)
    busy, span, steps = 0.0, 0.0, 0
    for a, b in zip(samples[len(samples) // 4 :], samples[len(samples) // 4 + 1 : len(samples) * 3 // 4]):
        step = kernels[a + 1 : b + 1]
        steps += 1
        span += step[-1].time_range.end - step[0].time_range.start
        for p, n in zip(step, step[1:]):
            gaps[f"{kind(p.name)} -> {kind(n.name)}"].append(n.time_range.start - p.time_range.end)
        busy += sum(e.time_range.end - e.time_range.start for e in step)
    rows: list[dict[str, float | str]] = [
        {"pair": k, "count_per_step": len(v) / steps, "mean_us": sum(v) / len(v), "us_per_step": sum(v) / steps}
        for k, v in sorted(gaps.items(), key=lambda kv: -sum(kv[1]))
    ]
    print(
        f"{steps} steps: {span / steps:.0f} us per step, kernels {busy / steps:.0f} us, "
        f"gaps {(span - busy) / steps:.0f} us"
    )
    print(f"{'pair':<32}{'per step':>9}{'mean us':>9}{'us/step':>9}")
    for r in rows:
        print(f"{r['pair']!s:<32}{r['count_per_step']:>9.1f}{r['mean_us']:>9.2f}{r['us_per_step']:>9.1f}")
    with open(args.out, "w") as f:
        json.dump(
            {
                "gpu": torch.cuda.get_device_name(),
                "steps": steps,
                "us_per_step": span / steps,
                "kernel_us_per_step": busy / steps,
                "gaps": rows,
            },
            f,
            indent=1,
        )
    llm.shutdown()


if __name__ == "__main__":
    main()
