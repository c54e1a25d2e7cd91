"""Can torch.compile's max-autotune find a faster GEMM than cuBLAS at the decode shapes? (issue #17; GPU)

    source .whl/use-bundle.sh && python benchmarks/inductor_gemm.py --out $OUT/inductor_gemm.json

For each projection of Qwen3-0.6B at 32-256 rows: F.linear (cuBLAS) against the kernel Inductor's max-autotune picks
among its Triton templates (persistent TMA ones included) and cuBLAS. Timed as the model runs them: 28 calls, each
on its own weight copy (so the weights come from HBM, not L2), captured in one CUDA graph, replayed.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
LAYERS = 28


def graph_us(fn, x: torch.Tensor, ws: list[torch.Tensor]) -> float:
    for w in ws[:2]:
        fn(x, w)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for w in ws:
            fn(x, w)
    for _ in range(3):
        g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps / len(ws)


def main() -> None:
    import torch._inductor.config as ic

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="32,64,128,256")
    ap.add_argument("--out", default="inductor_gemm.json")
    args = ap.parse_args()
    ic.max_autotune_gemm_backends = "ATEN,TRITON"
    ic.triton.enable_persistent_tma_matmul = True
    dev = torch.device("cuda")
    rows = []
    print(f"{'proj':<8}{'M':>5}{'cuBLAS us':>11}{'autotuned us':>14}{'ratio':>7}")
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            torch._dynamo.reset()
            tuned = torch.compile(lambda a, b: F.linear(a, b), mode="max-autotune-no-cudagraphs", dynamic=False)
            ref = F.linear(x, ws[0])
            err = ((tuned(x, ws[0]).float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            base = graph_us(F.linear, x, ws)
            auto = graph_us(tuned, x, ws)
            rows.append({"proj": name, "m": m, "n": n, "k": k, "cublas_us": base, "autotuned_us": auto, "rel_err": err})
            print(f"{name:<8}{m:>5}{base:>11.2f}{auto:>14.2f}{auto / base:>7.2f}  err {err:.1e}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
