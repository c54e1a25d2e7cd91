"""The fused sampler's noise: tl.rand's Philox (before) against the hash in kernels/triton_ops.py (issue #17; GPU):

    source .whl/use-bundle.sh && python benchmarks/sampler_rng.py

Times `sample_gumbel` on bf16 logits of Qwen3-0.6B's vocabulary for 32-256 rows, each kernel in its own CUDA
graph (us per call, median of 20 replays), and prints the bytes-only floor (the logits read once).
"""

from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl

from kernels import triton_ops

VOCAB = 151936


@triton.jit
def _philox_sample_kernel(
    logits_ptr, stride, V, temp_ptr, seed_ptr, val_ptr, idx_ptr, n_chunks, BLOCK: tl.constexpr
):  # the kernel as it was, for the A/B
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    seed = tl.load(seed_ptr + row)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    x = tl.load(logits_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    if temp > 0:
        u = tl.rand(seed, cols)
        x = x / temp - tl.log(-tl.log(u))
    x = tl.where(mask, x, -float("inf"))
    tl.store(val_ptr + row * n_chunks + chunk, tl.max(x, axis=0))
    tl.store(idx_ptr + row * n_chunks + chunk, tl.argmax(x, axis=0) + chunk * BLOCK)


def philox_sample(logits: torch.Tensor, temps: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    B, V = logits.shape
    block = 2048
    n_chunks = triton.cdiv(V, block)
    vals = torch.empty((B, n_chunks), dtype=torch.float32, device=logits.device)
    idx = torch.empty((B, n_chunks), dtype=torch.int64, device=logits.device)
    _philox_sample_kernel[(B, n_chunks)](logits, logits.stride(0), V, temps, seeds, vals, idx, n_chunks, BLOCK=block)
    return idx.gather(1, vals.argmax(1, keepdim=True)).squeeze(1)


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


def main() -> None:
    torch.manual_seed(0)
    print(f"{'rows':>5}{'philox us':>11}{'hash us':>9}{'floor us':>10}")
    for rows in (32, 128, 256):
        logits = torch.randn(rows, VOCAB, device="cuda", dtype=torch.bfloat16)
        temps = torch.full((rows,), 0.6, device="cuda")
        seeds = torch.arange(rows, device="cuda")
        old = graph_us(lambda logits=logits, temps=temps, seeds=seeds: philox_sample(logits, temps, seeds))
        new = graph_us(lambda logits=logits, temps=temps, seeds=seeds: triton_ops.sample_gumbel(logits, temps, seeds))
        floor = rows * VOCAB * 2 / 3.0e12 * 1e6  # bf16 logits read once at 3 TB/s
        print(f"{rows:>5}{old:>11.1f}{new:>9.1f}{floor:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
