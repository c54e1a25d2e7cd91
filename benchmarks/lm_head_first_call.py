"""Whether an eager GEMM's first call at a new row count waits for the GPU: behind a 50 ms GPU sleep, time the host
side of F.linear at the LM head's shape (Qwen3-0.6B: [M, 1024] x [151936, 1024]^T, bf16) for row counts never run
before, then again at the same counts; and what running every count from 1 to 256 once costs (the engine's start-up
warm-up, engine/runner.py). `--layers` does the same for the decoder layer's GEMMs (Qwen3-0.6B, whole and as one
rank's slice at TP=2) at the token counts of eager mixed steps. `--consecutive` runs the fused q/k/v GEMM at
neighbouring counts (1000, 1001, ... 1011): whether the wait comes once per row count or once per cuBLAS kernel (the
kernel cuBLAS picks changes with the count, and a kernel's first launch loads it).
Usage (GPU): python benchmarks/lm_head_first_call.py [--layers] [--consecutive] [--blas cublaslt] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

# Qwen3-0.6B, [out, in]: fused q/k/v, o, fused gate/up, down; a TP=2 rank holds half of each sharded dimension
LAYERS = {
    "qkv": (4096, 1024),
    "o": (1024, 2048),
    "gate_up": (6144, 1024),
    "down": (1024, 3072),
    "qkv_tp2": (2048, 1024),
    "o_tp2": (1024, 1024),
    "gate_up_tp2": (3072, 1024),
    "down_tp2": (1024, 1536),
}


def host_ms(fn: object, sleep_cycles: int) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return 1e3 * dt


def first_and_again(w: torch.Tensor, h: torch.Tensor, counts: list[int], sleep: int) -> dict[str, object]:
    first = {m: host_ms(lambda m=m: F.linear(h[:m], w), sleep) for m in counts}
    again = {m: host_ms(lambda m=m: F.linear(h[:m], w), sleep) for m in counts}
    return {
        "first_call_host_ms": first,
        "second_call_host_ms": again,
        "first_call_median_ms": statistics.median(first.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", action="store_true", help="the decoder layer's GEMMs too, at mixed-step token counts")
    ap.add_argument("--consecutive", action="store_true", help="the q/k/v GEMM at neighbouring counts")
    ap.add_argument("--blas", choices=["cublas", "cublaslt"], default=None, help="torch's preferred BLAS library")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    dev = torch.device("cuda")
    w = torch.randn(151936, 1024, dtype=torch.bfloat16, device=dev)
    h = torch.randn(4096, 3072, dtype=torch.bfloat16, device=dev)
    sleep = int(1e8)  # ~50-60 ms at H100 clocks
    t = time.perf_counter()
    torch.cuda._sleep(sleep)
    torch.cuda.synchronize()
    sleep_ms = 1e3 * (time.perf_counter() - t)
    F.linear(h[:64, :1024], w)  # cuBLAS handle and workspace
    lm_head = first_and_again(w, h[:, :1024], [37, 101, 173, 211, 250], sleep)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for m in range(1, 257):
        F.linear(h[:m, :1024], w)
    torch.cuda.synchronize()
    warm_ms = 1e3 * (time.perf_counter() - t)
    after = {m: host_ms(lambda m=m: F.linear(h[:m, :1024], w), sleep) for m in (5, 77, 199, 255)}
    out: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "blas": str(torch.backends.cuda.preferred_blas_library()),
        "gpu_sleep_ms": sleep_ms,
        **lm_head,
        "warm_up_1_to_256_ms": warm_ms,
        "after_warm_up_host_ms": after,
    }
    if args.layers:
        layers = {}
        for name, (n, k) in LAYERS.items():
            lw = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
            F.linear(h[:64, :k], lw)
            layers[name] = first_and_again(lw, h[:, :k], [203, 517, 1111, 1229, 2333, 4001], sleep)
        out["layers"] = layers
    if args.consecutive:
        n, k = LAYERS["qkv"]
        qkv = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
        F.linear(h[:64, :k], qkv)
        counts = [*range(1000, 1012), 1000, 1005, *range(3000, 3006), 2048, 2304, 2560, 4096, 4352, 6000, 6001, 7000]
        out["qkv_consecutive_host_ms"] = [[m, host_ms(lambda m=m: F.linear(h[:m, :k], qkv), sleep)] for m in counts]
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
