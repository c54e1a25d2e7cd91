"""Where the idle time between a decode step's kernels goes (issue #17; GPU):

    source .whl/use-bundle.sh && python benchmarks/kernel_gaps.py --out $OUT/kernel_gaps.json

Runs 256 requests of dummy Qwen3-0.6B (prompts of 512 tokens, 64 output tokens) under torch.profiler, takes the
CUDA-graph decode steps at full batch, and sums the time between one kernel's end and the next kernel's start by the
pair of kernel kinds (the kinds of benchmarks/step_profile.py). The sum of a step's kernel times falls short of the
step's GPU time by these gaps. With --offline it runs bench-offline's default workload instead (256 requests,
133,966 output tokens) and sums the gaps over the whole run, host<->device copies included, to find where the GPU
idles between the first kernel and the last.
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
from minisgl_cli.bench_offline import OFFLINE_ENGINE


def kind(name: str) -> str:
    return next((c for c, rx in KERNEL_KINDS if re.search(rx, name)), "other")


def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--out", default="kernel_gaps.json")
    ap.add_argument("--offline", action="store_true", help="the whole offline workload, copies included")
    args = ap.parse_args()
    llm = LLM(EngineConfig(model=args.model, **(OFFLINE_ENGINE if args.offline else {})))
    if args.offline:
        whole_workload(llm, args.out)
        llm.shutdown()
        return
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


def whole_workload(llm: LLM, out: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    from minisgl_cli.workload import random_workload

    wl = random_workload(256, vocab_size=llm.engine.model_cfg.vocab_size)
    # as bench-offline asks: token ids only, final outputs only
    params = [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True, detokenize=False) for n in wl.output_lens]
    llm.generate(wl.prompts[:32], [SamplingParams(max_tokens=16, temperature=0.6, ignore_eos=True)] * 32)
    llm.generate(wl.prompts, params, on_progress=lambda *_: None)  # a fresh GPU runs slower for its first ~30 s
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(wl.prompts, params, on_progress=lambda *_: None)
        torch.cuda.synchronize()
    ops = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.name),
        key=lambda e: e.time_range.start,
    )

    def kind_of(name: str) -> str:
        return "memcpy" if "Memcpy" in name else "memset" if "Memset" in name else kind(name)

    gaps: dict[str, list[float]] = defaultdict(list)
    longest: list[tuple[float, float, str]] = []
    end = ops[0].time_range.start
    for p, n in zip(ops, ops[1:]):
        end = max(end, p.time_range.end)
        gap = n.time_range.start - end
        if gap > 0:
            gaps[f"{kind_of(p.name)} -> {kind_of(n.name)}"].append(gap)
            if gap > 200:
                at = (n.time_range.start - ops[0].time_range.start) / 1e3
                longest.append((gap, at, f"{p.name[:40]} -> {n.name[:40]}"))
    tenth = (ops[-1].time_range.end - ops[0].time_range.start) / 10
    print(
        "idle in gaps over 200 us, ms per tenth of the run:",
        [round(sum(g for g, at, _ in longest if i * tenth <= at * 1e3 < (i + 1) * tenth) / 1e3, 1) for i in range(10)],
    )
    for gap, at, what in sorted(longest, reverse=True)[:25]:
        print(f"  {gap:8.0f} us at {at:7.1f} ms  {what}")
    # A few whole steps, op by op (each step ends with its sampler kernel): where in a step the GPU waits.
    samples = [i for i, e in enumerate(ops) if "_sample_kernel" in e.name]
    for frac in (0.1, 0.3, 0.5, 0.7, 0.9, 0.97):
        a, b = samples[int(len(samples) * frac)], samples[int(len(samples) * frac) + 1]
        t0 = ops[a].time_range.end
        print(f"\nstep at {frac:.0%} of the run: {b - a} ops, {(ops[b].time_range.end - t0) / 1e3:.2f} ms")
        prev_end = t0
        for e in ops[a + 1 : b + 1]:
            gap = e.time_range.start - prev_end
            if gap > 3 or kind_of(e.name) not in ("gemm", "rmsnorm", "silu", "qkv-fused", "attention"):
                at = (e.time_range.start - t0) / 1e3
                print(f"  +{at:7.3f} ms gap {gap:7.1f} us  {kind_of(e.name):<10}{e.name[:50]}")
            prev_end = max(prev_end, e.time_range.end)
    span = ops[-1].time_range.end - ops[0].time_range.start
    idle = sum(sum(v) for v in gaps.values())
    busy = span - idle
    hist: dict[str, float] = defaultdict(float)
    for v in gaps.values():
        for g in v:
            hist[next(f"<= {b} us" for b in (1, 2, 5, 10, 20, 50, 100, 1000, 10**9) if g <= b)] += g / 1e3
    rows = [
        {"pair": k, "count": len(v), "mean_us": sum(v) / len(v), "ms": sum(v) / 1e3}
        for k, v in sorted(gaps.items(), key=lambda kv: -sum(kv[1]))
    ][:30]
    print(f"span {span / 1e3:.0f} ms, busy {busy / 1e3:.0f} ms, idle {idle / 1e3:.0f} ms in {len(ops)} GPU ops")
    print("idle ms by gap length:", {k: round(v, 1) for k, v in hist.items()})
    print(f"{'pair':<32}{'count':>8}{'mean us':>9}{'ms':>9}")
    for r in rows:
        print(f"{r['pair']!s:<32}{r['count']:>8}{r['mean_us']:>9.2f}{r['ms']:>9.1f}")
    with open(out, "w") as f:
        json.dump(
            {
                "gpu": torch.cuda.get_device_name(),
                "span_ms": span / 1e3,
                "busy_ms": busy / 1e3,
                "idle_ms_by_gap_length": hist,
                "gaps": rows,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
