"""The decode step's GEMMs at Qwen3-0.6B's shapes: torch's cuBLAS against FlashInfer's `mm_bf16` backends (issue #17).
GPU only:

    source .whl/use-bundle.sh && python benchmarks/flashinfer_gemm.py --out $OUT/flashinfer_gemm.json

FlashInfer 0.7's `mm_bf16` offers on sm90 cuBLASLt (its heuristic's candidates, each timed by FlashInfer's autotuner
when tuning is on), TinyGEMM (a small-M bf16 kernel) and cuDNN. Each backend is tuned once per (shape, rows) under
`flashinfer.autotuner.autotune()`, then 28 calls (one per layer, 28 distinct weights, so L2 holds none between uses)
run eagerly under torch.profiler, and the GPU time of their kernels is reported per call: kernel time alone, since
FlashInfer's Python dispatch makes eager calls CPU-bound, and its cuBLASLt runner broke CUDA-graph capture here (the
first run of this script), so graph timing as in benchmarks/gemm_shapes.py could not be used. A backend that
refuses a shape or fails to build is reported with its error."""

from __future__ import annotations

import argparse
import json

import torch
from gemm_shapes import LAYERS, SHAPES  # this script's folder is on sys.path when run as a script

BACKENDS = ("cublaslt", "tinygemm", "cudnn")


def kernel_us(fn, calls: int = LAYERS) -> float:
    """GPU time of the kernels `calls` calls of fn(i) launch, per call (the second of two profiled passes)."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(i)
        torch.cuda.synchronize()
    total = sum(
        e.time_range.end - e.time_range.start for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )
    return total / calls


def main() -> None:
    import flashinfer
    from flashinfer.autotuner import autotune

    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="8,32,64,128,192,256")
    ap.add_argument("--out", default="flashinfer_gemm.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights = {
        name: [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
        for name, (n, k) in SHAPES.items()
    }
    rows: list[dict] = []
    for m in [int(v) for v in args.ms.split(",")]:
        for name, (n, k) in SHAPES.items():
            ws = weights[name]
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x, ws[0]).float()
            us: dict[str, float] = {
                "torch": kernel_us(lambda i, x=x, ws=ws: torch.nn.functional.linear(x, ws[i % LAYERS]))
            }
            errors: dict[str, str] = {}
            max_err: dict[str, float] = {}
            for backend in BACKENDS:
                try:
                    with autotune(True):
                        flashinfer.mm_bf16(x, ws[0].t(), backend=backend)
                    torch.cuda.synchronize()
                    out = flashinfer.mm_bf16(x, ws[0].t(), backend=backend)
                    max_err[backend] = (out.float() - ref).abs().max().item()
                    us[backend] = kernel_us(
                        lambda i, x=x, ws=ws, b=backend: flashinfer.mm_bf16(x, ws[i % LAYERS].t(), backend=b)
                    )
                except Exception as e:  # a backend that cannot run here: record why, time the others
                    errors[backend] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(dict(m=m, shape=name, n=n, k=k, us=us, max_abs_err=max_err, errors=errors))
            print(
                f"M={m:<4}{name:<8}"
                + "".join(f"{kk:>10}{v:7.1f}us" for kk, v in us.items())
                + "".join(f"  [{kk} failed: {v[:80]}]" for kk, v in errors.items()),
                flush=True,
            )
    total = {b: sum(r["us"].get(b, float("nan")) for r in rows if r["m"] == 256) for b in ("torch", *BACKENDS)}
    print("sum over the four projections at 256 rows, us:", total)
    with open(args.out, "w") as f:
        json.dump(
            {
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "flashinfer": flashinfer.__version__,
                "rows": rows,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
