"""Why a prefill step's GPU time follows its CPU launch time (GPU). On an H100 the offline workload's 18 prefill steps
took 29 ms of GPU time each and 29 ms of CPU to launch, for ~12 ms of kernels: the GPU waits for the CPU.

    source .whl/use-bundle.sh && python benchmarks/prefill_cpu.py --out $OUT/prefill_cpu.json

Runs the offline workload once after a warm-up with the runner's phases timed on the CPU for every step that carries a
prefill chunk (prepare inputs, attention plan, model forward launch, logits + sampling launch), torch's CUDA sync
debug mode set to warn during them (a hidden host<->device sync shows as a warning), and cProfile over them. Then one
prefill batch of the same shape is replayed alone, synchronised, for its GPU time."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from minisgl_cli.bench_offline import OFFLINE_ENGINE
from minisgl_cli.workload import random_workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--out", default="prefill_cpu.json")
    args = ap.parse_args()
    llm = LLM(EngineConfig(model=args.model, **OFFLINE_ENGINE))  # as bench-offline runs
    cfg = llm.engine.model_cfg
    wl = random_workload(256, vocab_size=cfg.vocab_size)
    params = [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in wl.output_lens]
    llm.generate(wl.prompts[:32], [SamplingParams(max_tokens=8, temperature=0.6, ignore_eos=True)] * 32)

    runner = llm.engine.runner
    phases: dict[str, float] = defaultdict(float)
    active = [False]

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            if not active[0]:
                return fn(*a, **k)
            t = time.perf_counter()
            out = fn(*a, **k)
            phases[name] += time.perf_counter() - t
            return out

        return wrapper

    prepare = timed("prepare", runner.prepare)
    kept: list[Any] = []

    def keep_prepare(batch: Any) -> Any:
        out = prepare(batch)
        if active[0] and not kept:
            kept.append(out)  # the first prefill step's inputs, replayed alone below
        return out

    runner.prepare = keep_prepare  # type: ignore[method-assign]
    runner.backend.plan = timed("plan", runner.backend.plan)  # type: ignore[method-assign]
    model_call = runner.model.forward
    runner.model.forward = timed("forward", model_call)  # type: ignore[method-assign]
    runner.model.logits = timed("logits", runner.model.logits)  # type: ignore[method-assign]
    runner.sampler.sample = timed("sample", runner.sampler.sample)  # type: ignore[method-assign]
    orig_run = runner.run
    prof = cProfile.Profile()
    steps: list[dict] = []
    sync_warnings: list[str] = []

    def run(batch: Any) -> Any:
        if not batch.prefill_rows:
            return orig_run(batch)
        active[0] = True
        before = dict(phases)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t = time.perf_counter()
            prof.enable()
            out = orig_run(batch)
            prof.disable()
            cpu = time.perf_counter() - t
        torch.cuda.set_sync_debug_mode("default")
        end.record()
        active[0] = False
        sync_warnings.extend(f"{w.filename}:{w.lineno}: {w.message}" for w in caught)
        steps.append(
            dict(
                reqs=len(batch.reqs),
                decode_rows=batch.num_decode,
                tokens=batch.num_tokens,
                cpu_ms=cpu * 1e3,
                phases_ms={k: (phases[k] - before.get(k, 0.0)) * 1e3 for k in phases},
                events=(start, end),
            )
        )
        return out

    runner.run = run  # type: ignore[method-assign]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(wl.prompts, params)
    torch.cuda.synchronize()
    dur = time.perf_counter() - t0
    runner.run = orig_run  # type: ignore[method-assign]
    for s in steps:
        a, b = s.pop("events")
        s["gpu_ms"] = a.elapsed_time(b)
    tokens = sum(len(o.token_ids) for o in outs)

    # The first prefill step's inputs again (its pages are free now, which changes no kernel's time), alone and
    # synchronised: plan + forward launch on the CPU, then the forward's GPU time with the CPU out of the way.
    with torch.inference_mode():
        alone = []
        graph_free = []
        ids, pos, meta = kept[0]
        for _ in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            runner.backend.plan(meta)
            model_call(ids, pos, runner.backend)
            alone.append((time.perf_counter() - t) * 1e3)
        for _ in range(5):
            runner.backend.plan(meta)
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            model_call(ids, pos, runner.backend)
            b.record()
            torch.cuda.synchronize()
            graph_free.append(a.elapsed_time(b))

        from torch.profiler import ProfilerActivity, profile

        runner.backend.plan(meta)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as kprof:
            model_call(ids, pos, runner.backend)
            torch.cuda.synchronize()
    kernel_table = kprof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=90)

    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    by_tot = buf.getvalue()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
    by_cum = buf.getvalue()
    total = {k: sum(st["phases_ms"].get(k, 0.0) for st in steps) for k in phases}
    res = dict(
        gpu=torch.cuda.get_device_name(),
        tokens=tokens,
        duration=dur,
        output_throughput=tokens / dur,
        prefill_steps=steps,
        phase_totals_ms=total,
        cpu_ms_total=sum(st["cpu_ms"] for st in steps),
        gpu_ms_total=sum(st["gpu_ms"] for st in steps),
        first_prefill_plan_forward_cpu_ms=alone,
        first_prefill_forward_gpu_ms=graph_free,
        sync_warnings=sorted(set(sync_warnings)),
        first_prefill_kernels=kernel_table,
        cprofile_tottime=by_tot,
        cprofile_cumulative=by_cum,
    )
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{tokens / dur:.0f} tok/s; {len(steps)} steps with prefill rows")
    print(f"cpu {res['cpu_ms_total']:.0f} ms, gpu {res['gpu_ms_total']:.0f} ms; phases {json.dumps(total)}")
    for st in steps:
        print(
            f"  reqs {st['reqs']:>4} decode {st['decode_rows']:>4} tokens {st['tokens']:>5} "
            f"cpu {st['cpu_ms']:6.1f} gpu {st['gpu_ms']:6.1f} "
            + " ".join(f"{k} {v:.1f}" for k, v in st["phases_ms"].items())
        )
    print("first prefill plan + forward launch alone, cpu ms:", [round(x, 1) for x in alone])
    print("first prefill forward alone, gpu ms:", [round(x, 2) for x in graph_free])
    print("sync warnings:", *res["sync_warnings"][:20], sep="\n  ")
    print(kernel_table)
    print(by_tot[:3000])
    llm.shutdown()


if __name__ == "__main__":
    main()
