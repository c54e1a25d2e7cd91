"""The GPU's streaming read rate, the ceiling for decode attention (GPU; issue #17). Run there:

    source .whl/use-bundle.sh && python benchmarks/read_rate.py [--mb 1117] [--out $OUT/read_rate.json]

Reads one contiguous bf16 buffer of --mb megabytes (1,117 MB is one layer's K and V at 256 offline rows) with a
Triton kernel in several shapes (elements per program per step, warps, programs per SM) and torch's `sum`, each
timed over 20 CUDA-graph replays; prints TB/s. The decode attention reads the same bytes scattered in 4-8 KB runs,
so the best of these is what it can reach.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import triton
import triton.language as tl


@triton.jit
def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, STEP: tl.constexpr):
    # each program reads every STEP-th BLOCK; the sum keeps the loads alive
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK, n, STEP):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def graph_us(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / iters)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=1117)
    ap.add_argument("--out")
    args = ap.parse_args()
    n = args.mb * 2**20 // 2
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []

    def report(name: str, us: float) -> None:
        rows.append(dict(kernel=name, us=us, tb_per_s=n * 2 / us / 1e6))
        print(f"{name:28} {us:8.1f} us {n * 2 / us / 1e6:5.2f} TB/s", flush=True)

    report("torch.sum", graph_us(lambda: x.sum()))
    for block in (2048, 4096, 8192):
        for warps in (4, 8, 16):
            for per_sm in (1, 2, 4, 8):
                progs = sms * per_sm
                out = torch.empty(progs, device="cuda", dtype=torch.float32)
                fn = functools.partial(_read[(progs,)], x, out, n, BLOCK=block, STEP=block * progs, num_warps=warps)
                try:
                    report(f"triton b{block} w{warps} p{per_sm}", graph_us(fn))
                except Exception as e:  # noqa: BLE001  # a shape that does not fit is reported
                    print(f"triton b{block} w{warps} p{per_sm}: {type(e).__name__}")
    best = max(rows, key=lambda r: r["tb_per_s"])
    print(f"best: {best['kernel']} {best['tb_per_s']:.2f} TB/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), mb=args.mb, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
