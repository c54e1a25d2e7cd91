"""One pass over every matmul of a SmolLM2-135M decode step (30 layers of qkv, o, gate-up, down, plus the LM head)
on the CPU, per way of running a linear layer: eager F.linear in fp32 (the engine's transposed layout) and bf16, and
weights prepacked once for the CPU's GEMM library (MKL for fp32, oneDNN for bf16: AMX tiles where the CPU has
them). Prints ms per pass at M = 1 (a single stream) and M = 16 (the batch benchmark); medians of --repeats.
Usage: python benchmarks/cpu_linear_ab.py [--threads 2] [--repeats 7] [--json out.json]"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

H, FF, Q, KV, V, LAYERS = 576, 1536, 9 * 64, 3 * 64, 49152, 30
SHAPES = [(Q + 2 * KV, H), (H, Q), (2 * FF, H), (H, FF)]  # [out, in]


def ways(weights: list[torch.Tensor], m: int) -> dict[str, Callable[[list[torch.Tensor]], list[Any]]]:
    out: dict[str, Callable[[list[torch.Tensor]], list[Any]]] = {}
    t32 = [w.t().contiguous().t() for w in weights]  # [out, in] view of an [in, out] matrix: engine's CPU layout
    out["fp32 eager (engine layout)"] = lambda xs: [F.linear(x, w) for x, w in zip(xs, t32)]
    b16 = [w.to(torch.bfloat16) for w in weights]
    out["bf16 eager"] = lambda xs: [F.linear(x.to(torch.bfloat16), w) for x, w in zip(xs, b16)]
    try:
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, m) for w in b16]
        out["bf16 oneDNN prepacked"] = lambda xs: [
            torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), p, None, "none", [], "")
            for x, p in zip(xs, packed)
        ]
    except (RuntimeError, AttributeError) as e:
        print(f"bf16 oneDNN prepacked: unavailable ({e})")
    try:
        mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in weights]
        out["fp32 MKL prepacked"] = lambda xs: [
            torch.ops.mkl._mkl_linear(x, p, w, None, m) for x, p, w in zip(xs, mkl, weights)
        ]
    except (RuntimeError, AttributeError) as e:
        print(f"fp32 MKL prepacked: unavailable ({e})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    weights = [torch.randn(o, i) * 0.02 for _ in range(LAYERS) for o, i in SHAPES] + [torch.randn(V, H) * 0.02]
    res: dict = {"threads": a.threads, "capability": torch.backends.cpu.get_cpu_capability(), "ms_per_pass": {}}
    with torch.inference_mode():
        for m in (1, 16):
            xs = [torch.randn(m, w.shape[1]) for w in weights]
            fns = ways(weights, m)
            ref = [F.linear(x, w) for x, w in zip(xs[-1:], weights[-1:])][0]
            times: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(a.repeats):  # interleaved, so drift from other users hits every way alike
                for k, fn in fns.items():
                    t = time.perf_counter()
                    fn(xs)
                    times[k].append((time.perf_counter() - t) * 1e3)
            for k, fn in fns.items():
                last = fn(xs)[-1].float()
                err = ((last - ref).abs().max() / ref.abs().max()).item()
                med = statistics.median(times[k])
                res["ms_per_pass"][f"M={m} {k}"] = med
                print(f"M={m:2} {k:28} {med:8.2f} ms per pass (LM head rel. err {err:.1e})")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
