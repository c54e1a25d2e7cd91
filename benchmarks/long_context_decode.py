"""One long request among many short ones: decode steps with FlashInfer's own split (the decode graphs) against a
fixed split of each request's KV (flashinfer_backend.FIXED_SPLIT_PAGES, eager attention between piecewise graphs).
GPU only:

    source .whl/use-bundle.sh && python benchmarks/long_context_decode.py --out $OUT/long_context.json

One engine (dummy Qwen3-0.6B, the engine's defaults: decode graphs, piecewise graphs, overlap); each round runs the
same generate() once per mode, in turn: one prompt of --long tokens and --rows - 1 prompts of 100-1024 tokens (the
offline workload's lengths), --max-tokens output tokens each, the radix cache cleared first. Prints per mode the wall
time, output tok/s and the median time between two decode steps once every prompt is in (each step's outputs, as
on_step sees them).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from engine.llm import LLM
from engine.sampling_params import SamplingParams
from kernels.attention import flashinfer_backend as fb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--long", type=int, default=32768)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="fixed32,flashinfer")
    ap.add_argument("--out")
    args = ap.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randint(0, 9999) for _ in range(args.long)]]
    prompts += [[rng.randint(0, 9999) for _ in range(rng.randint(100, 1024))] for _ in range(args.rows - 1)]
    llm = LLM(model=args.model, max_running_requests=max(256, args.rows))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.6, seed=0, ignore_eos=True, detokenize=False)
    llm.generate(prompts[1:9], SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False))  # warm-up
    rows = []
    for rnd in range(args.rounds):
        for mode in args.modes.split(","):
            fb.FIXED_SPLIT_PAGES = int(mode.removeprefix("fixed")) if mode.startswith("fixed") else 0
            stamps: list[tuple[float, int]] = []

            def stamp(outputs: list, into: list[tuple[float, int]] = stamps) -> None:
                into.append((time.perf_counter(), len(outputs)))

            llm.reset_prefix_cache()  # every run prefills its prompts, as the first does (applied before the timing)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, on_step=stamp)
            wall = time.perf_counter() - t0
            tokens = sum(len(o.token_ids) for o in outs)
            # decode steps with every request running: their outputs count all rows
            full = [t for t, n in stamps if n == args.rows]
            gaps = [b - a for a, b in zip(full, full[1:])]
            median = 1e3 * statistics.median(gaps) if gaps else float("nan")
            row = dict(round=rnd, mode=mode, wall_s=wall, tok_s=tokens / wall, steps=len(stamps),
                       full_steps=len(full), step_ms_median=median)  # fmt: skip
            rows.append(row)
            print(
                f"round {rnd} {mode:10} wall {wall:6.2f} s  {tokens / wall:8.0f} tok/s  steps {len(stamps):4}  "
                f"median step with all {args.rows} rows {row['step_ms_median']:.2f} ms",
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as f:
            meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, args=vars(args))
            json.dump(dict(meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
