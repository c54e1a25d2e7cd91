"""The two decode GEMMs with only 1,024 outputs (o and down at Qwen3-0.6B's shapes), cuBLAS against a Triton split-K
kernel whose last CTA per output tile sums the K slices in a fixed order (deterministic, one launch; issue #17).
GPU only:

    source .whl/use-bundle.sh && python benchmarks/splitk_gemm.py --out $OUT/splitk_gemm.json

With N = 1,024 a plain tiling has few output tiles for the GPU's 132 SMs, so each CTA walks a long K; splitting K
gives every SM a share of the weights to stream. Each case: 28 layers with their own weights in one CUDA graph,
us per call (median of 7 replays), the best of a few tiles and splits, its error against an fp32 product, and
whether two calls give the same bits.
H100 (benchmarks/results/throughput_h100/splitk_gemm.txt): 0.96-1.40x cuBLAS's time at 32-256 rows; not adopted.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from gemm_shapes import graph_us  # this script's folder is on sys.path when run as a script

LAYERS = 28
SHAPES = {"o": (1024, 2048), "down": (1024, 3072)}  # name: (N, K)
CONFIGS = [  # BM, BN, BK, SPLIT, warps, stages
    (bm, bn, bk, split, 4, 4) for bm, bn in ((64, 32), (64, 64), (32, 64)) for bk in (64, 128) for split in (2, 4, 8)
]


@triton.jit
def _splitk_kernel(
    x_ptr, w_ptr, y_ptr, part_ptr, count_ptr, M, N, K, sx, sw, sy,
    SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FENCE: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    s = tl.program_id(1)
    num_m = tl.cdiv(M, BM)
    pid_m = tile % num_m
    pid_n = tile // num_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k_per = K // SPLIT  # the host checks K % (SPLIT * BK) == 0
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(s * k_per, (s + 1) * k_per, BK):
        k = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * sx + k[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(w_ptr + rn[:, None] * sw + k[None, :], mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
    mn_mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = rm[:, None] * N + rn[None, :]
    tl.store(part_ptr + s * M * N + offs, acc, mask=mn_mask)
    if FENCE:  # each thread's partial visible GPU-wide before the CTA says it is done
        tl.inline_asm_elementwise(
            "fence.acq_rel.gpu;\n\tmov.u32 $0, 0;", "=r,r", [rm], dtype=tl.int32, is_pure=False, pack=1
        )
    tl.debug_barrier()
    done = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    if done == SPLIT - 1:  # the last slice of this tile to finish sums them all, in slice order
        total = tl.zeros((BM, BN), dtype=tl.float32)
        for i in range(SPLIT):
            total += tl.load(part_ptr + i * M * N + offs, mask=mn_mask, other=0.0, cache_modifier=".cg")
        tl.store(y_ptr + rm[:, None] * sy + rn[None, :], total.to(y_ptr.dtype.element_ty), mask=mn_mask)
        tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next call (and the next graph replay)


class SplitK:
    """y = x W^T through _splitk_kernel, with its partial-sum and counter buffers kept between calls."""

    def __init__(self, max_m: int, n: int, max_split: int, device: torch.device):
        self.part = torch.empty(max_split * max_m * n, dtype=torch.float32, device=device)
        self.count = torch.zeros(4096, dtype=torch.int32, device=device)

    def __call__(self, x: torch.Tensor, w: torch.Tensor, cfg: tuple) -> torch.Tensor:
        bm, bn, bk, split, warps, stages = cfg
        m, k = x.shape
        n = w.shape[0]
        assert k % (split * bk) == 0
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), split)
        _splitk_kernel[grid](
            x, w, y, self.part, self.count, m, n, k, x.stride(0), w.stride(0), y.stride(0),
            split, bm, bn, bk, x.is_cuda, num_warps=warps, num_stages=stages,
        )  # fmt: skip
        return y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="32,64,128,192,256")
    ap.add_argument("--out", default="splitk_gemm.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
        gemm = SplitK(256, n, 8, dev)
        for m in [int(v) for v in args.ms.split(",")]:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = x.float() @ ws[0].float().t()
            cublas = graph_us(lambda i, x=x, ws=ws: torch.nn.functional.linear(x, ws[i % LAYERS]), LAYERS)
            cublas_err = ((torch.nn.functional.linear(x, ws[0]).float() - ref).abs().max()).item()
            best: dict | None = None
            best_us = float("inf")
            for cfg in CONFIGS:
                if k % (cfg[3] * cfg[2]):
                    continue
                y1, y2 = gemm(x, ws[0], cfg), gemm(x, ws[0], cfg)
                us = graph_us(lambda i, x=x, ws=ws, cfg=cfg, gemm=gemm: gemm(x, ws[i % LAYERS], cfg), LAYERS)
                row = dict(cfg=cfg, us=us, err=(y1.float() - ref).abs().max().item(), same_bits=torch.equal(y1, y2))
                if us < best_us:
                    best, best_us = row, us
            assert best is not None
            rows.append(dict(shape=name, m=m, n=n, k=k, cublas_us=cublas, cublas_err=cublas_err, best=best))
            print(
                f"{name:5} M={m:<4} cublas {cublas:6.1f} us (err {cublas_err:.2e})   split-K {best['us']:6.1f} us "
                f"{best['cfg']} err {best['err']:.2e} same bits {best['same_bits']}   {best_us / cublas:.2f}x",
                flush=True,
            )
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
