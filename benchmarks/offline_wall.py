"""Where an offline run's wall time goes outside the GPU's busy span (issue #17; GPU):

    source .whl/use-bundle.sh && python benchmarks/offline_wall.py --out $OUT/offline_wall.json

bench-offline's default workload (256 requests, 133,966 output tokens) on dummy Qwen3-0.6B, as bench-offline runs
it (a cold cache per run). Per run: the wall time of generate(), the time its add_request calls take before the
first step, the first and last step's return times; one run under torch.profiler (CUDA only) gives the span from
the first GPU operation to the last, so wall - span is host time the GPU never overlaps; one run under cProfile
gives the host's time by function.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from kernels.attention import flashinfer_backend
from minisgl_cli.bench_offline import OFFLINE_ENGINE
from minisgl_cli.workload import random_workload, warmup_like


def device_allocs() -> int:
    """cudaMalloc calls made so far by torch's caching allocator (a new segment each)."""
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0)) if torch.cuda.is_available() else 0


def timed_run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams], lean: bool = False) -> dict[str, float]:
    """lean: step times through on_progress (no outputs for running requests) instead of on_step."""
    llm.reset_prefix_cache()  # now: a clear pending at generate() would have it add every prompt first
    allocs = device_allocs()
    steps: list[float] = []
    added: list[float] = []
    add = llm.add_request

    def timed_add(*a, **k):  # the last add's return is when generate() starts stepping
        rid = add(*a, **k)
        added.append(time.perf_counter())
        return rid

    llm.add_request = timed_add  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        stamp = lambda *_: steps.append(time.perf_counter())  # noqa: E731
        if lean:
            outs = llm.generate(prompts, params, on_progress=stamp, use_tqdm=False)
        else:
            outs = llm.generate(prompts, params, on_step=stamp, use_tqdm=False)
        wall = time.perf_counter() - t0
    finally:
        del llm.add_request
    tokens = sum(len(o.token_ids) for o in outs)
    return {
        "wall_s": wall,
        "tok_s": tokens / wall,
        "add_requests_ms": (added[-1] - t0) * 1e3,
        "first_step_return_ms": (steps[0] - t0) * 1e3,
        "after_last_step_ms": (t0 + wall - steps[-1]) * 1e3,
        "steps": len(steps),
        "device_allocs": device_allocs() - allocs,
    }


def profiled_runs(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[dict[str, float], str]:
    from torch.profiler import ProfilerActivity, profile

    llm.reset_prefix_cache()  # now: a clear pending at generate() would have it add every prompt first
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        llm.generate(prompts, params, on_progress=lambda *_: None)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    ops = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.name]
    span = (max(e.time_range.end for e in ops) - min(e.time_range.start for e in ops)) / 1e6
    busy = 0.0
    end = None
    for e in sorted(ops, key=lambda e: e.time_range.start):
        s, t = e.time_range.start, e.time_range.end
        if end is None or s >= end:
            busy += t - s
            end = t
        elif t > end:
            busy += t - end
            end = t
    profiled = {"wall_s": wall, "gpu_span_s": span, "gpu_busy_s": busy / 1e6, "outside_span_s": wall - span}
    print("under the CUDA profiler:", {k: round(v, 3) for k, v in profiled.items()})

    llm.reset_prefix_cache()  # now: a clear pending at generate() would have it add every prompt first
    cp = cProfile.Profile()
    cp.enable()
    llm.generate(prompts, params, on_progress=lambda *_: None)
    cp.disable()
    text = io.StringIO()
    pstats.Stats(cp, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue()[-6000:])

    return profiled, text.getvalue()[-6000:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="offline_wall.json")
    ap.add_argument("--ab-detokenize", action="store_true", help="runs with text against token ids only")
    ap.add_argument("--ab-lean", action="store_true", help="outputs every step against final outputs only")
    ap.add_argument("--ab-ragged", action="store_true", help="prefill in one paged pass vs fresh prompts ragged")
    ap.add_argument("--ab-budget", help="per-step token budgets to compare, e.g. 8192,16384")
    ap.add_argument("--no-profiles", dest="profiles", action="store_false", help="timed runs only")
    ap.add_argument(
        "--warmup",
        choices=["small", "shapes", "full"],
        default="full",
        help="small: bench-offline's 4 x 8 tokens; shapes: 256 other prompts of the workload's lengths x 8",
    )
    args = ap.parse_args()
    llm = LLM(EngineConfig(model=args.model, **OFFLINE_ENGINE))  # as bench-offline runs
    wl = random_workload(256, vocab_size=llm.engine.model_cfg.vocab_size)
    params = [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in wl.output_lens]
    # as bench-offline asks: token ids only (and, in the timed runs, final outputs only)
    ids_only = [
        SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True, detokenize=False) for n in wl.output_lens
    ]
    llm.generate(wl.prompts[:4], SamplingParams(max_tokens=8, temperature=0.6, ignore_eos=True))
    if args.warmup == "shapes":  # bench-offline's warm-up
        other = warmup_like(wl, llm.engine.model_cfg.vocab_size)
        llm.generate(other.prompts, SamplingParams(max_tokens=8, temperature=0.6, ignore_eos=True))
    if args.warmup == "full":
        print("warm-up run:", timed_run(llm, wl.prompts, params))  # a fresh GPU runs slower for its first ~30 s

    if args.ab_detokenize or args.ab_lean or args.ab_ragged or args.ab_budget:  # interleaved, order alternating
        # detokenize: with the text (as before d7603a6) vs token ids only; lean: token ids only, outputs every step
        # (on_step) vs final outputs only (on_progress); ragged: as bench-offline runs, the prefill attention in one
        # paged pass vs fresh prompts through the ragged kernel (flashinfer_backend.RAGGED_PREFILL); budget: as
        # bench-offline runs, under each per-step token budget (the scheduler's max_batch_tokens)
        arms: dict[str, tuple[list[SamplingParams], bool]] = (
            {"text": (params, False), "ids": (ids_only, False)}
            if args.ab_detokenize
            else {"every-step": (ids_only, False), "final-only": (ids_only, True)}
            if args.ab_lean
            else {"paged": (ids_only, True), "ragged": (ids_only, True)}
            if args.ab_ragged
            else {f"budget {b}": (ids_only, True) for b in args.ab_budget.split(",")}
        )
        budget0 = llm.engine.scheduler.max_batch_tokens
        ab: dict[str, list[float]] = {k: [] for k in arms}
        for i in range(args.runs):
            for name in list(arms) if i % 2 == 0 else list(arms)[::-1]:
                flashinfer_backend.RAGGED_PREFILL = name != "paged"
                budget = name.removeprefix("budget ")
                llm.engine.scheduler.max_batch_tokens = int(budget) if budget != name else budget0
                r = timed_run(llm, wl.prompts, arms[name][0], lean=arms[name][1])
                ab[name].append(r["tok_s"])
                print(name, {k: round(v, 1) for k, v in r.items()}, flush=True)
        print({k: round(statistics.median(v)) for k, v in ab.items()})
        with open(args.out, "w") as f:
            json.dump(
                {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "ab": ab}, f, indent=1
            )
        llm.shutdown()
        return

    runs = [timed_run(llm, wl.prompts, ids_only, lean=True) for _ in range(args.runs)]
    for r in runs:
        print({k: round(v, 1) for k, v in r.items()})

    profiled, top = profiled_runs(llm, wl.prompts, ids_only) if args.profiles else ({}, "")
    result = {
        "gpu": torch.cuda.get_device_name(),
        "warmup": args.warmup,
        "runs": runs,
        "median_tok_s": statistics.median(r["tok_s"] for r in runs),
        "profiled": profiled,
        "cprofile_top_tottime": top,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
