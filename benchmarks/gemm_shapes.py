"""The decode step's GEMMs at Qwen3-0.6B's shapes, cuBLAS against a plain Triton kernel (issue #17). GPU only:

    source .whl/use-bundle.sh && python benchmarks/gemm_shapes.py --out $OUT/gemm_shapes.json

Each case runs one projection for 28 layers (28 distinct weight copies, so L2 holds no layer's weights between its
uses, as in the model) inside one CUDA graph and reports us per call, the weights' read rate (TB/s) and TFLOP/s.
Kernels: `cublas` (torch's default), `cublaslt`, `triton` (the best of a small set of tiles, no split-K) and, for
the down projection, `triton-silu` (SiLU(gate) * up computed while loading the A tiles: one kernel instead of two,
timed against `cublas+silu`, the model's current pair). Also: `gap`, the time per kernel of a graph of 280 empty
kernels (the floor of each kernel boundary in a decode step), with and without programmatic dependent launch.
H100 (benchmarks/results/throughput_h100/gemm_shapes.txt): cuBLAS 5.4-8.6 us per projection from 8 to 256 rows, the
best Triton tile 0-2.5 us slower, SiLU in the down GEMM's prologue 30-50 us slower; an empty kernel 1.08 us in a graph,
0.71 us with PDL. cuBLAS stays.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

HIDDEN, INTER, Q, KV, VOCAB, LAYERS = 1024, 3072, 2048, 1024, 151936, 28
SHAPES = {  # name: (N, K)
    "qkv": (Q + 2 * KV, HIDDEN),
    "o": (HIDDEN, Q),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
}
TILES = [  # BM, BN, BK, warps, stages
    (16, 64, 128, 4, 4),
    (32, 64, 128, 4, 4),
    (64, 32, 128, 4, 4),
    (64, 64, 64, 4, 4),
    (64, 64, 128, 4, 3),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 8, 4),
    (128, 128, 64, 8, 3),
]


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, sx, sw, sy, SILU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    """y = x W^T; with SILU, x holds [gate | up] (2K columns) and the A operand is SiLU(gate) * up in bf16."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m  # the M blocks of one W tile run side by side: W is read from HBM about once
    pid_n = pid // num_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a_ptr = x_ptr + rm[:, None] * sx + (k0 + rk)[None, :]
        a_mask = (rm[:, None] < M) & ((k0 + rk)[None, :] < K)
        if SILU:
            g = tl.load(a_ptr, mask=a_mask, other=0.0).to(tl.float32)
            u = tl.load(a_ptr + K, mask=a_mask, other=0.0).to(tl.float32)
            a = (g / (1.0 + tl.exp(-g)) * u).to(tl.bfloat16)
        else:
            a = tl.load(a_ptr, mask=a_mask, other=0.0)
        b = tl.load(w_ptr + rn[:, None] * sw + (k0 + rk)[None, :], mask=(rn[:, None] < N) & ((k0 + rk)[None, :] < K))
        acc = tl.dot(a, tl.trans(b), acc)
    tl.store(y_ptr + rm[:, None] * sy + rn[None, :], acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_linear(x: torch.Tensor, w: torch.Tensor, tile: tuple, silu: bool = False) -> torch.Tensor:
    bm, bn, bk, warps, stages = tile
    m, n, k = x.shape[0], w.shape[0], w.shape[1]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _gemm_kernel[grid](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0), silu, bm, bn, bk, num_warps=warps, num_stages=stages
    )
    return y


@triton.jit
def _empty_kernel(p, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if tl.program_id(0) == 0:
        tl.store(p, 1.0)


def graph_us(fn, calls: int, reps: int = 7) -> float:
    """us per call of `fn` (one call = one layer's worth), captured `calls` times in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    from kernels.triton_ops import silu_and_mul

    return silu_and_mul(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="8,32,64,128,192,256")
    ap.add_argument("--out", default="gemm_shapes.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows: list[dict] = []
    weights = {
        name: [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
        for name, (n, k) in SHAPES.items()
    }
    default_blas = torch.backends.cuda.preferred_blas_library()
    for m in [int(v) for v in args.ms.split(",")]:
        for name, (n, k) in SHAPES.items():
            ws = weights[name]
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x, ws[0]).float()
            flops, nbytes = 2 * m * n * k, n * k * 2
            res: dict[str, float] = {}
            for blas in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(default_blas if blas == "cublas" else "cublaslt")
                res[blas] = graph_us(lambda i, x=x, ws=ws: torch.nn.functional.linear(x, ws[i % LAYERS]), LAYERS)
            torch.backends.cuda.preferred_blas_library(default_blas)
            best = None
            for tile in TILES:
                if tile[0] > max(16, triton.next_power_of_2(m)) * 2:
                    continue
                err = (triton_linear(x, ws[0], tile).float() - ref).abs().max().item()
                us = graph_us(lambda i, x=x, ws=ws, tile=tile: triton_linear(x, ws[i % LAYERS], tile), LAYERS)
                if best is None or us < best[0]:
                    best = (us, tile, err)
            assert best is not None
            res["triton"] = best[0]
            row = dict(m=m, shape=name, n=n, k=k, triton_tile=list(best[1]), triton_max_abs_err=best[2])
            if name == "down":
                xu = torch.randn(m, 2 * k, device=dev, dtype=torch.bfloat16)
                ref_s = torch.nn.functional.linear(silu_mul(xu), ws[0]).float()
                res["cublas+silu"] = graph_us(
                    lambda i, xu=xu, ws=ws: torch.nn.functional.linear(silu_mul(xu), ws[i % LAYERS]), LAYERS
                )
                best_s = None
                for tile in TILES:
                    if tile[0] > max(16, triton.next_power_of_2(m)) * 2:
                        continue
                    us = graph_us(
                        lambda i, xu=xu, ws=ws, tile=tile: triton_linear(xu, ws[i % LAYERS], tile, True), LAYERS
                    )
                    if best_s is None or us < best_s[0]:
                        best_s = (us, tile)
                assert best_s is not None
                res["triton-silu"] = best_s[0]
                row["triton_silu_tile"] = list(best_s[1])
                row["triton_silu_max_abs_err"] = (
                    (triton_linear(xu, ws[0], best_s[1], True).float() - ref_s).abs().max().item()
                )
            row["us"] = res
            row["weights_tb_per_s"] = {kk: nbytes / (v * 1e-6) / 1e12 for kk, v in res.items()}
            row["tflops"] = {kk: flops / (v * 1e-6) / 1e12 for kk, v in res.items()}
            rows.append(row)
            print(
                f"M={m:<4}{name:<8}"
                + "".join(f"{kk:>13}{v:8.1f}us" for kk, v in res.items())
                + f"   tile {best[1]} err {best[2]:.3g}",
                flush=True,
            )
    flag = torch.zeros(1, device=dev)
    gap = {}
    for pdl in (False, True):
        gap[f"pdl={pdl}"] = graph_us(lambda i, pdl=pdl: _empty_kernel[(132,)](flag, pdl, launch_pdl=pdl), 280)
    print("empty kernel in a graph, us each:", gap)
    with open(args.out, "w") as f:
        json.dump(
            {
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "triton": triton.__version__,
                "rows": rows,
                "empty_kernel_us": gap,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
