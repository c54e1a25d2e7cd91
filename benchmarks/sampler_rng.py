"""The fused sampler's noise (issue #17; GPU): tl.rand's Philox (first), the 32-bit hash with tl.log (second), and
the hash with both logs on the special-function unit (kernels/triton_ops.py now):

    source .whl/use-bundle.sh && python benchmarks/sampler_rng.py

Times each on bf16 logits of Qwen3-0.6B's vocabulary for 32-256 rows, each kernel in its own CUDA graph (us per
call, median of 20 replays), with the greedy path, the hash without logs and the bytes-only floor (the logits read
once) for scale. Then counts, over 10,240 rows, how often each hash variant draws the token that the same noise
computed in float64 gives.
"""

from __future__ import annotations

import statistics
import sys
from functools import partial

import torch
import triton
import triton.language as tl

from kernels import triton_ops

VOCAB = 151936


@triton.jit
def _variant_kernel(
    logits_ptr, stride, V, temp_ptr, seed_ptr, val_ptr, idx_ptr, n_chunks, BLOCK: tl.constexpr, MODE: tl.constexpr
):  # the kernels before, for the A/B. MODE 0: the hash with tl.log (before the SFU logs); 1: the hash without
    # the logs (timing only, wrong distribution); 2: tl.rand's Philox with tl.log (before the hash)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    seed = tl.load(seed_ptr + row)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    x = tl.load(logits_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    if temp > 0:
        if MODE == 2:
            x = x / temp - tl.log(-tl.log(tl.rand(seed, cols)))
        else:
            key = triton_ops._mix32(seed.to(tl.uint32))
            h = triton_ops._mix32(((cols.to(tl.uint32) * 0x9E3779B9).to(tl.uint32)) ^ key) >> 8
            if MODE == 1:
                x = x * (1.0 / temp) + h.to(tl.float32) * (1.0 / 16777216.0)
            else:
                u = (h.to(tl.float32) + 0.5) * (1.0 / 16777216.0)
                x = x * (1.0 / temp) - tl.log(-tl.log(u))
    x = tl.where(mask, x, -float("inf"))
    best, at = tl.max(x, axis=0, return_indices=True)
    tl.store(val_ptr + row * n_chunks + chunk, best)
    tl.store(idx_ptr + row * n_chunks + chunk, at + chunk * BLOCK)


def variant_sample(logits: torch.Tensor, temps: torch.Tensor, seeds: torch.Tensor, mode: int) -> torch.Tensor:
    B, V = logits.shape
    block = 2048
    n_chunks = triton.cdiv(V, block)
    vals = torch.empty((B, n_chunks), dtype=torch.float32, device=logits.device)
    idx = torch.empty((B, n_chunks), dtype=torch.int64, device=logits.device)
    _variant_kernel[(B, n_chunks)](
        logits, logits.stride(0), V, temps, seeds, vals, idx, n_chunks, BLOCK=block, MODE=mode
    )
    return idx.gather(1, vals.argmax(1, keepdim=True)).squeeze(1)


def exact_sample(logits: torch.Tensor, temp: float, seeds: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max draw from the kernels' hash, in float64 (int64 products cut back to 32 bits as they do)."""
    m32 = 0xFFFFFFFF

    def mix(x: torch.Tensor) -> torch.Tensor:
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & m32
        x = x ^ (x >> 15)
        x = (x * 0x846CA68B) & m32
        return x ^ (x >> 16)

    cols = torch.arange(logits.shape[1], device=logits.device, dtype=torch.int64)
    key = mix(seeds.to(torch.int64) & m32)[:, None]
    h = mix(((cols * 0x9E3779B9) & m32)[None, :] ^ key) >> 8
    u = (h.double() + 0.5) / 16777216.0
    return (logits.double() / temp - torch.log(-torch.log(u))).argmax(-1)


def graph_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def sweep() -> None:
    """The engine's kernel at other chunk sizes and warp counts (greedy and temperature 0.6); each result is
    checked against the default's."""
    print(f"{'rows':>5}{'block':>7}{'warps':>6}{'temp us':>9}{'greedy us':>10}")
    for rows in (64, 128, 256):
        logits = torch.randn(rows, VOCAB, device="cuda", dtype=torch.bfloat16)
        temps = torch.full((rows,), 0.6, device="cuda")
        seeds = torch.arange(rows, device="cuda")
        zero = torch.zeros_like(temps)
        want = triton_ops.sample_gumbel(logits, temps, seeds), triton_ops.sample_gumbel(logits, zero, seeds)
        for block in (1024, 2048, 4096, 8192):
            for warps in (4, 8, 16):
                if block // (32 * warps) < 2:
                    continue
                fn = partial(triton_ops.sample_gumbel, block=block, num_warps=warps)
                got = fn(logits, temps, seeds), fn(logits, zero, seeds)
                assert all(torch.equal(a, b) for a, b in zip(got, want)), (block, warps)
                t = graph_us(partial(fn, logits, temps, seeds))
                g = graph_us(partial(fn, logits, zero, seeds))
                print(f"{rows:>5}{block:>7}{warps:>6}{t:>9.1f}{g:>10.1f}", flush=True)


def main() -> None:
    if "--sweep" in sys.argv:
        return sweep()
    torch.manual_seed(0)
    cols = ("philox", "tl.log", "SFU logs", "greedy", "no logs", "floor")
    print(f"{'rows':>5}" + "".join(f"{c + ' us':>13}" for c in cols))
    for rows in (32, 128, 256):
        logits = torch.randn(rows, VOCAB, device="cuda", dtype=torch.bfloat16)
        temps = torch.full((rows,), 0.6, device="cuda")
        seeds = torch.arange(rows, device="cuda")
        zero = torch.zeros_like(temps)
        us = [
            graph_us(partial(variant_sample, logits, temps, seeds, 2)),
            graph_us(partial(variant_sample, logits, temps, seeds, 0)),
            graph_us(partial(triton_ops.sample_gumbel, logits, temps, seeds)),
            graph_us(partial(triton_ops.sample_gumbel, logits, zero, seeds)),
            graph_us(partial(variant_sample, logits, temps, seeds, 1)),
            rows * VOCAB * 2 / 3.0e12 * 1e6,  # bf16 logits read once at 3 TB/s
        ]
        print(f"{rows:>5}" + "".join(f"{t:>13.1f}" for t in us), flush=True)
    # Both kernels against the same hash's noise in float64: which one draws the exact Gumbel-max token.
    logits = torch.randn(256, VOCAB, device="cuda", dtype=torch.bfloat16) * 3
    temps = torch.full((256,), 0.6, device="cuda")
    hits = {"tl.log": 0, "SFU logs": 0, "agree": 0}
    total = 0
    for s in range(40):
        seeds = torch.arange(256, device="cuda") + 1000 * s
        ref = exact_sample(logits, 0.6, seeds)
        a, b = variant_sample(logits, temps, seeds, 0), triton_ops.sample_gumbel(logits, temps, seeds)
        hits["tl.log"] += int((a == ref).sum())
        hits["SFU logs"] += int((b == ref).sum())
        hits["agree"] += int((a == b).sum())
        total += 256
    print(f"rows drawing the float64 reference's token, of {total}: {hits}")


if __name__ == "__main__":
    main()
