"""Which host calls of an engine step wait for queued GPU work (GPU).

    source .whl/use-bundle.sh && python benchmarks/launch_sync_check.py --out $OUT/launch_sync.json

Under overlap scheduling the engine launches step N+1 while step N runs on the GPU, and only then reads step N's
tokens. A host call that waits for the GPU (a blocking copy, an allocation that frees cached memory, a read of a device
value) holds both back: step N's tokens reach the streams late, and the GPU idles through the rest of the launch. The
saturated replay's step log (benchmarks/results/serving_h100/mixed_ab_trace_steps.tgz) shows such steps: launches of a
mixed step taking 25-40 ms against 6-8 ms typically, and the step before it delivered that much later.

Here: R requests decode (dummy Qwen3-0.6B); before each measured step a ~50 ms GPU sleep is queued, then the step is
taken with each host call timed (scheduling, input building, attention plans, graph replays, logits, sampling, output
copies, token processing). A call that waited for the GPU takes about as long as the sleep. Decode steps, and steps
where a prompt of L tokens arrives (mixed), with the piecewise graphs on and off."""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams


def cycles_per_ms() -> float:
    """The GPU's clock for torch.cuda._sleep, measured."""
    torch.cuda._sleep(10**6)  # warm up
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(10**8)
    b.record()
    b.synchronize()
    return 10**8 / a.elapsed_time(b)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--running", type=int, default=192)
    ap.add_argument("--length", type=int, default=1000, help="arriving prompt's tokens (mixed steps)")
    ap.add_argument("--sleep-ms", type=float, default=50.0)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default="launch_sync.json")
    args = ap.parse_args()

    llm = LLM(EngineConfig(model=args.model))
    eng = llm.engine
    runner = eng.runner
    calls: dict[str, float] = defaultdict(float)

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                calls[name] += (time.perf_counter() - t) * 1e3

        return wrapper

    # Instance attributes shadow the methods: every caller (runner, graphs, pieces) goes through the timers.
    targets: list[tuple[Any, str]] = [
        (eng.scheduler, "schedule"),
        (eng, "_process"),
        (runner, "prepare"),
        (runner, "kv_layout"),
        (runner, "_output"),
        (runner, "_prompt_logprobs"),
        (runner.backend, "plan"),
        (runner.sampler, "sample"),
        (runner.model, "logits"),
    ]
    if hasattr(runner.backend, "plan_graph"):
        targets.append((runner.backend, "plan_graph"))
    if runner.graphs is not None:
        targets.append((runner.graphs, "run"))
    pieces = runner.pieces
    if pieces is not None:
        targets.append((pieces, "run"))
    for obj, name in targets:
        label = f"{type(obj).__name__}.{name}"
        setattr(obj, name, timed(label, getattr(obj, name)))

    cpms = cycles_per_ms()
    vocab = eng.model_cfg.vocab_size
    g = torch.Generator().manual_seed(0)

    def prompt(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    steps_needed = 4 * args.reps * 3 + 64
    bg = SamplingParams(max_tokens=steps_needed, temperature=0, ignore_eos=True)
    for _ in range(args.running):
        llm.add_request(prompt(256), bg)
    while eng.scheduler.waiting or eng.scheduler.prefilling:
        llm.step()
    for _ in range(8):
        llm.step()

    results: list[dict[str, Any]] = []
    for mode in ("pieces", "eager") if pieces is not None else ("eager",):
        runner.pieces = pieces if mode == "pieces" else None
        for kind in ("decode", "mixed"):
            for rep in range(args.reps):
                if kind == "mixed":
                    llm.add_request(prompt(args.length), SamplingParams(max_tokens=1, ignore_eos=True))
                torch.cuda.synchronize()
                torch.cuda._sleep(int(args.sleep_ms * cpms))
                calls.clear()
                t = time.perf_counter()
                llm.step()
                total = (time.perf_counter() - t) * 1e3
                torch.cuda.synchronize()
                row = dict(mode=mode, kind=kind, rep=rep, step_ms=total, calls=dict(calls))
                results.append(row)
                waited = {k: round(v, 1) for k, v in calls.items() if v > 0.5 * args.sleep_ms}
                print(f"{mode:6} {kind:6} step {total:6.1f} ms  waited in: {waited or '-'}", flush=True)
                llm.step()  # the arriving prompt's own step settles before the next measurement
    runner.pieces = pieces
    with open(args.out, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), args=vars(args), results=results), f, indent=1)


if __name__ == "__main__":
    main()
