"""Whether an eager GEMM's first call at a new row count waits for the GPU: behind a 50 ms GPU sleep, time the host
side of F.linear at the LM head's shape (Qwen3-0.6B: [M, 1024] x [151936, 1024]^T, bf16) for row counts never run
before, then again at the same counts; and what running every count from 1 to 256 once costs (the engine's start-up
warm-up, engine/runner.py). Usage (GPU): python benchmarks/lm_head_first_call.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def host_ms(fn: object, sleep_cycles: int) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return 1e3 * dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    w = torch.randn(151936, 1024, dtype=torch.bfloat16, device=dev)
    h = torch.randn(256, 1024, dtype=torch.bfloat16, device=dev)
    sleep = int(1e8)  # ~50-60 ms at H100 clocks
    t = time.perf_counter()
    torch.cuda._sleep(sleep)
    torch.cuda.synchronize()
    sleep_ms = 1e3 * (time.perf_counter() - t)
    F.linear(h[:64], w)  # cuBLAS handle and workspace
    counts = [37, 101, 173, 211, 250]
    first = {m: host_ms(lambda m=m: F.linear(h[:m], w), sleep) for m in counts}
    again = {m: host_ms(lambda m=m: F.linear(h[:m], w), sleep) for m in counts}
    torch.cuda.synchronize()
    t = time.perf_counter()
    for m in range(1, 257):
        F.linear(h[:m], w)
    torch.cuda.synchronize()
    warm_ms = 1e3 * (time.perf_counter() - t)
    after = {m: host_ms(lambda m=m: F.linear(h[:m], w), sleep) for m in (5, 77, 199, 255)}
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "gpu_sleep_ms": sleep_ms,
        "first_call_host_ms": first,
        "second_call_host_ms": again,
        "warm_up_1_to_256_ms": warm_ms,
        "after_warm_up_host_ms": after,
        "first_call_median_ms": statistics.median(first.values()),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
