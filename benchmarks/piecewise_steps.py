"""Piecewise CUDA graphs for prefill and mixed steps against the eager forward, interleaved in one process (GPU).

    source .whl/use-bundle.sh && python benchmarks/piecewise_steps.py --out $OUT/piecewise_steps.json

One engine (dummy Qwen3-0.6B by default) with the graphs captured; each measurement runs with the runner's pieces
on, then off (eager), then on and off again, and reports the medians:
- `lone`: time to the first token of one prompt of L tokens on an idle engine (generate(max_tokens=1)): the
  prefill step's launch + GPU time, what a chat user's TTFT is made of at light load.
- `mixed`: B requests decoding while, before every step, one new prompt of L tokens arrives (max_tokens=1): the
  mean period of K such steps, i.e. the running streams' inter-token gap while prompts keep arriving, and its p90.
Also the capture time, the sizes captured, and the GPU memory the pieces' pool holds."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams


def _prompt(n: int, g: torch.Generator, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def lone(llm: LLM, length: int, g: torch.Generator, reps: int) -> float:
    vocab = llm.engine.model_cfg.vocab_size
    times = []
    p = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    for _ in range(reps):
        prompt = _prompt(length, g, vocab)  # a new one each time: no radix-cache hit
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate([prompt], p)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def mixed(llm: LLM, running: int, length: int, steps: int, g: torch.Generator) -> dict[str, float]:
    eng = llm.engine
    vocab = eng.model_cfg.vocab_size
    bg = SamplingParams(max_tokens=steps + 64, temperature=0, ignore_eos=True)
    rids = [llm.add_request(_prompt(256, g, vocab), bg) for _ in range(running)]
    llm.step()
    while eng.scheduler.waiting or eng.scheduler.prefilling:
        llm.step()
    for _ in range(4):
        llm.step()
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    gaps = []
    mixed0 = eng.stats["mixed_steps"]
    torch.cuda.synchronize()
    last = time.perf_counter()
    for _ in range(steps):
        llm.add_request(_prompt(length, g, vocab), one)
        llm.step()
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    mixed_steps = eng.stats["mixed_steps"] - mixed0
    for rid in rids:
        llm.abort(rid)
    while llm.has_work():
        llm.step()
    gaps.sort()
    return dict(mean_ms=1e3 * sum(gaps) / len(gaps), p90_ms=1e3 * gaps[int(0.9 * len(gaps))], mixed_steps=mixed_steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--tokens", type=int, default=2048, help="piecewise_graph_tokens")
    ap.add_argument("--lengths", default="16,128,512,1024,2000")
    ap.add_argument(
        "--running",
        default="0,64,192",
        help="decoding requests beside the arrivals (0: lone prompt; below --max-running-requests, else arrivals wait)",
    )
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default="piecewise_steps.json")
    args = ap.parse_args()
    free0 = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0
    llm = LLM(EngineConfig(model=args.model, piecewise_graph_tokens=args.tokens))
    runner = llm.engine.runner
    pieces = runner.pieces
    assert pieces is not None and pieces.enabled, "no piecewise graphs (FlashInfer and CUDA needed)"
    res: dict[str, Any] = dict(
        model=args.model,
        gpu=torch.cuda.get_device_name(),
        sizes=pieces.sizes,
        capture_seconds=pieces.capture_seconds,
        decode_capture_seconds=runner.graphs.capture_seconds if runner.graphs else 0.0,
        startup=llm.engine.startup_seconds,
        free_gb_before_engine=free0 / 2**30,
        rows=[],
    )
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}), flush=True)
    g = torch.Generator().manual_seed(0)
    llm.generate([_prompt(600, g, 1000)] * 8, SamplingParams(max_tokens=32))  # warm-up
    for running in [int(x) for x in args.running.split(",")]:
        for length in [int(x) for x in args.lengths.split(",")]:
            row: dict[str, Any] = dict(running=running, length=length, on=[], off=[])
            for mode in ("on", "off", "on", "off"):
                runner.pieces = pieces if mode == "on" else None
                r = lone(llm, length, g, 7) if running == 0 else mixed(llm, running, length, args.steps, g)
                row[mode].append(r)
            runner.pieces = pieces
            key = (lambda r: r) if running == 0 else (lambda r: r["mean_ms"])
            row["on_ms"] = statistics.median(key(r) for r in row["on"])
            row["off_ms"] = statistics.median(key(r) for r in row["off"])
            row["ratio"] = row["on_ms"] / row["off_ms"]
            print(
                f"running {running:3d} prompt {length:5d}: pieces {row['on_ms']:7.2f} ms  eager {row['off_ms']:7.2f} ms"
                f"  ({row['ratio']:.2f}x)",
                flush=True,
            )
            res["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
