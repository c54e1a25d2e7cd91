"""Do a decode step's GEMMs run faster when their weights were pulled into L2 while the attention streamed KV?
(issue #17; GPU only)

    source .whl/use-bundle.sh && python benchmarks/l2_prefetch.py --out $OUT/l2_prefetch.json

At Qwen3-0.6B's shapes cuBLAS takes 32-40 us per layer for ~10.5 us of weight bytes (docs/gpu.md): each projection
is latency-bound, too few CTAs each streaming a long strip of the weight from HBM. The attention before them is
bound by HBM bandwidth and takes 20-400 us a layer. If the layer's o, gate_up and down weights (and the next layer's
qkv) are asked for while the attention runs, with an eviction priority that keeps them in L2 while the KV streams
past, the GEMMs read L2 instead of HBM. The bytes from HBM are the same; what changes is when they are read.

A decode step of 28 layers with their own weights and paged KV (offline lengths, pages scattered), one CUDA graph:
- `base`: RMSNorm, qkv, FlashInfer tensor-core decode, o, RMSNorm, gate_up, SiLU, down per layer (the engine's);
- `pf-last`: before the attention a small kernel issues `prefetch.global.L2::evict_last` for every 128-byte line
  of the 30 MB (fire and forget, so the attention starts at once), same stream;
- `pf-normal`: the same with a plain `prefetch.global.L2`;
- `pf-side`: `pf-last`'s kernel on a second stream forked before the attention, joined after it;
- `ld-side`: real loads with `evict_last` (Triton's `eviction_policy`), summed, on the second stream;
- `pf-gemm`, `pf-gemm-last`: after the attention instead, so nothing competes with its KV reads: the gate_up and down
  weights and the next layer's qkv (26 MB) asked for on the second stream while the o projection runs, joined at
  the layer's end (plain and `evict_last` prefetches).
Each mode runs without and then with the L2 set-aside for persisting accesses at its maximum
(`cudaLimitPersistingL2CacheSize`), since evict_last may only keep lines inside that set-aside.
Prints ms per step and the ratio to `base`; checks every mode gives `base`'s output.
H100 (benchmarks/results/session28/h100_l2_prefetch/): every mode slower than `base` at 16-256 rows, with or without
the set-aside (`pf-side` 1.023-1.119x without, 1.000-1.065x with; `ld-side` 1.14-2.18x), and the set-aside alone made
`base` 2.7-6.7% slower: not adopted. After the attention (session29/h100_l2_prefetch_gemm/): `pf-gemm` 1.008-1.013x
with 32 prefetch programs, 1.011-1.028x with 132; `pf-gemm-last` 1.010-1.015x: not adopted either.
"""

from __future__ import annotations

import argparse
import ctypes
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from layer_chain import (  # this script's folder is on sys.path
    DIM,
    EPS,
    HEADS,
    HIDDEN,
    DecodeBatch,
    Q,
    interleaved_step_ms,
    layer_weights,
)

from kernels import triton_ops

LINE_ELEMS = 64  # bf16 elements in a 128-byte line


@triton.jit
def _prefetch_kernel(ptr, n_lines, LAST: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    for start in range(pid * BLOCK, n_lines, step):
        idx = tl.minimum(start + tl.arange(0, BLOCK), n_lines - 1).to(tl.int64)
        if LAST:
            tl.inline_asm_elementwise(
                "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;",
                "=r,l",
                [ptr + idx * 64],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )
        else:
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;",
                "=r,l",
                [ptr + idx * 64],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )


@triton.jit
def _load_kernel(ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK, n, step):
        idx = start + tl.arange(0, BLOCK)
        acc += tl.load(ptr + idx, mask=idx < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def prefetch(ts: list[torch.Tensor], last: bool, ctas: int) -> None:
    for t in ts:
        n = t.numel() // LINE_ELEMS
        _prefetch_kernel[(ctas,)](t, n, LAST=last, BLOCK=256, num_warps=4)


def load(ts: list[torch.Tensor], sink: torch.Tensor, ctas: int) -> None:
    for t in ts:
        _load_kernel[(ctas,)](t, sink, t.numel(), BLOCK=2048, num_warps=8)


def set_persisting_l2(fraction: float) -> tuple[int, int]:
    """Sets the persisting L2 set-aside to `fraction` of its maximum; returns (set-aside, L2 size) in bytes."""
    rt = ctypes.CDLL("libcudart.so.13")
    dev, v = torch.cuda.current_device(), ctypes.c_int()
    assert rt.cudaDeviceGetAttribute(ctypes.byref(v), 108, dev) == 0  # cudaDevAttrMaxPersistingL2CacheSize
    max_persist = v.value
    assert rt.cudaDeviceGetAttribute(ctypes.byref(v), 38, dev) == 0  # cudaDevAttrL2CacheSize
    size = int(max_persist * fraction)
    assert rt.cudaDeviceSetLimit(6, ctypes.c_size_t(size)) == 0  # cudaLimitPersistingL2CacheSize
    return size, v.value


def run_batch(batch: int, weights: list[dict], dev: torch.device, modes: list[str], ctas: int) -> dict:
    bf = torch.bfloat16
    db = DecodeBatch.draw(batch, torch.Generator().manual_seed(batch), dev)
    kv, lens, attn = db.kv, db.lens, db.wrapper(dev)
    side = torch.cuda.Stream()
    sink = torch.zeros(ctas, device=dev, dtype=torch.float32)

    def ahead(i: int) -> list[torch.Tensor]:
        w = weights[i]
        nxt = [weights[i + 1]["qkv"]] if i + 1 < len(weights) else []
        return [w["o"], w["gu"], w["down"], *nxt]

    def behind(i: int) -> list[torch.Tensor]:
        return ahead(i)[1:]  # all but o, which the projection running beside the prefetch reads

    def step(mode: str, x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        cur = torch.cuda.current_stream()
        for i, w in enumerate(weights):
            h = triton_ops.rmsnorm(x, w["n1"], EPS, res)
            qkv = F.linear(h, w["qkv"])
            q = qkv[:, :Q].reshape(-1, HEADS, DIM)
            if mode in ("pf-last", "pf-normal"):
                prefetch(ahead(i), mode == "pf-last", ctas)
            elif mode in ("pf-side", "ld-side"):
                side.wait_stream(cur)
                with torch.cuda.stream(side):
                    if mode == "pf-side":
                        prefetch(ahead(i), True, ctas)
                    else:
                        load(ahead(i), sink, ctas)
            o = attn.run(q, kv[i]).reshape(-1, Q)
            if mode in ("pf-side", "ld-side"):
                cur.wait_stream(side)
            if mode in ("pf-gemm", "pf-gemm-last"):  # after the attention, beside the o projection
                side.wait_stream(cur)
                with torch.cuda.stream(side):
                    prefetch(behind(i), mode == "pf-gemm-last", ctas)
            h = triton_ops.rmsnorm(F.linear(o, w["o"]), w["n2"], EPS, res)
            x = F.linear(triton_ops.silu_and_mul(F.linear(h, w["gu"])), w["down"])
            if mode in ("pf-gemm", "pf-gemm-last"):
                cur.wait_stream(side)
        return x

    x0 = torch.randn(batch, HIDDEN, device=dev, dtype=bf)
    r0 = torch.randn(batch, HIDDEN, device=dev, dtype=bf)
    ms, outs = interleaved_step_ms(step, modes, x0, r0, rounds=9, skip=2)
    err = {m: ((out - outs["base"]).norm() / outs["base"].norm()).item() for m, out in outs.items()}
    row = dict(batch=batch, kv_tokens=int(lens.sum()), ms=ms, rel_err=err)
    print(
        f"batch {batch:4} ({int(lens.sum()):7} KV tokens): "
        + "  ".join(f"{m} {v:.3f} ms ({v / ms['base']:.3f}x)" for m, v in ms.items())
        + "  err "
        + " ".join(f"{v:.0e}" for v in err.values()),
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,64,128,256")
    ap.add_argument("--modes", default="base,pf-last,pf-normal,pf-side,ld-side")
    ap.add_argument("--ctas", type=int, default=32, help="programs of the prefetch kernel")
    ap.add_argument("--persist", default="0,1", help="set-aside fractions of the maximum to run under")
    ap.add_argument("--out", default="l2_prefetch.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights = layer_weights(dev)
    modes = args.modes.split(",")
    result: dict = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, ctas=args.ctas, runs=[])
    for frac in [float(f) for f in args.persist.split(",")]:
        size, l2 = set_persisting_l2(frac)
        print(f"-- persisting L2 set-aside {size / 2**20:.1f} MiB of {l2 / 2**20:.1f} MiB", flush=True)
        rows = [run_batch(int(b), weights, dev, modes, args.ctas) for b in args.batches.split(",")]
        result["runs"].append(dict(persist_bytes=size, l2_bytes=l2, rows=rows))
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
