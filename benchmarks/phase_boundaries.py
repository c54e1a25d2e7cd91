"""What does a kernel boundary cost a chain of weight-streaming phases, against a grid-wide barrier inside one
persistent kernel? The number a decode megakernel's case rests on (issue #17; GPU only):

    source .whl/use-bundle.sh && python benchmarks/phase_boundaries.py --out $OUT/phase_boundaries.json

Qwen3-0.6B's 28 layers of projection weights (qkv, o, gate_up, down: 31.5 MB a layer, 881 MB in all, so L2 holds no
phase's matrix when it comes) are read in 112 phases, each mode captured in one CUDA graph and replayed in turn:
- `cublas-M`: the four projections of every layer as cuBLAS GEMMs at M rows, chained (the engine's GEMM kernels);
- `kernels`: each phase one streaming kernel that reads its matrix once (each program sums its blocks): 112 launches;
- `persistent`: one launch running the same 112 phases, with the same programs and blocks, separated by a grid-wide
  barrier (an atomic counter the programs spin on);
- `persistent-pf`: the same, each program asking L2 for its share of the next matrix before it waits;
- `persistent-pf-early`, `kernels-pf-next`: each program asks for its share of the next matrix before it reads its
  share of this one, so HBM has the next phase's bytes to move through the barrier or the kernel boundary;
- `kernels-pdlP` (P = 1, 2, 4): `kernels` launched with programmatic dependent launch. Each program loads its first
  P blocks before it waits for the kernel before it (weights depend on no earlier kernel; a GEMM's input would),
  then lets the next kernel launch, which can then load its own first blocks while this one streams the rest;
- `empty` / `barriers`: the boundaries alone, 112 empty kernels or one kernel with 111 barriers and no reads;
  `empty-pdl` the empty kernels launched with PDL, each waiting and then letting the next one launch.
H100 (docs/gpu.md): the best chain without PDL 21.1-22.1 us per layer (2.1x the bytes), no persistent mode better;
`kernels-pdl` with about each program's whole share loaded before the wait 15.3-15.4 (1.5x).
The floor is the 881 MB at the measured read rate (`x.sum()` over 2 GiB, printed). The streaming modes' sums must
agree (same programs, same blocks, same order; up to the compiler's order of the final in-program sum): the check
that every phase read all of its matrix.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from layer_chain import HIDDEN, INTER, KV, LAYERS, Q, interleaved_step_ms  # this script's folder is on sys.path

SPIN_LIMIT = 20_000  # polls before a barrier gives up (and says so): programs not all resident would hang


@triton.jit
def _read_phase(w_ptr, off, n, pid, nprog, BLOCK: tl.constexpr):
    """Program `pid` sums blocks pid, pid + nprog, ... of w[off : off + n]."""
    acc = tl.zeros((BLOCK,), tl.float32)
    for b in range(pid, (n + BLOCK - 1) // BLOCK, nprog):  # n is 32-bit in both callers
        idx = b * BLOCK + tl.arange(0, BLOCK)  # within one matrix: 32 bits hold it
        acc += tl.load(w_ptr + off + idx, mask=idx < n, other=0.0).to(tl.float32)
    return tl.sum(acc, axis=0)


@triton.jit
def _prefetch_block(w_ptr, off, n, b, BLOCK: tl.constexpr):
    """Ask L2 for block b of w[off : off + n], one request per 128-byte line; nothing waits for the data."""
    idx = tl.minimum(b * BLOCK + tl.arange(0, BLOCK // 64) * 64, n - 1)
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [w_ptr + off + idx], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _prefetch_share(w_ptr, off, n, pid, nprog, BLOCK: tl.constexpr):
    """Ask L2 for every block program `pid` will read of w[off : off + n]."""
    for b in range(pid, (n + BLOCK - 1) // BLOCK, nprog):
        _prefetch_block(w_ptr, off, n, b, BLOCK)


@triton.jit
def _grid_barrier(counter_ptr, target, flag_ptr, SPINS: tl.constexpr):
    """Arrive (one release add per program), spin on plain volatile loads (atomics would queue behind the arrivals
    at the one address), then one acquire read so what the others wrote before arriving is visible."""
    tl.debug_barrier()  # the whole program's writes come before its arrival
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = tl.load(counter_ptr, volatile=True)
    spins = 0
    while (seen < target) & (spins < SPINS):
        seen = tl.load(counter_ptr, volatile=True)
        spins += 1
    if tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu") < target:
        tl.atomic_add(flag_ptr, 1)
    tl.debug_barrier()


@triton.jit
def _persistent(
    w_ptr,
    offs_ptr,
    sizes_ptr,
    out_ptr,
    counter_ptr,
    flag_ptr,
    n_phases,
    READ: tl.constexpr,
    PREFETCH: tl.constexpr,
    BLOCK: tl.constexpr,
    SPINS: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for p in range(n_phases):
        if PREFETCH == 2:
            if p + 1 < n_phases:
                _prefetch_share(w_ptr, tl.load(offs_ptr + p + 1), tl.load(sizes_ptr + p + 1), pid, nprog, BLOCK)
        if READ:
            s = _read_phase(w_ptr, tl.load(offs_ptr + p), tl.load(sizes_ptr + p), pid, nprog, BLOCK)
            tl.store(out_ptr + p * nprog + pid, s)
        if p + 1 < n_phases:
            if PREFETCH == 1:
                _prefetch_share(w_ptr, tl.load(offs_ptr + p + 1), tl.load(sizes_ptr + p + 1), pid, nprog, BLOCK)
            _grid_barrier(counter_ptr, (p + 1) * nprog, flag_ptr, SPINS)


@triton.jit
def _phase(w_ptr, off, n, next_off, next_n, out_ptr, PREFETCH: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if PREFETCH:  # this program's share of the next matrix, asked for before its reads of this one
        _prefetch_share(w_ptr, next_off, next_n, pid, tl.num_programs(0), BLOCK)
    tl.store(out_ptr + pid, _read_phase(w_ptr, off, n, pid, tl.num_programs(0), BLOCK))


@triton.jit
def _phase_pdl(w_ptr, off, n, out_ptr, PRE: tl.constexpr, BLOCK: tl.constexpr):
    """`_phase` under PDL: blocks pid, pid + nprog, ... of the first PRE are loaded before the wait."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    idx = (pid + tl.arange(0, PRE) * nprog)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    first = tl.load(w_ptr + off + idx, mask=idx < n, other=0.0)
    tl.extra.cuda.gdc_wait()  # what the kernel before wrote is visible from here (a GEMM would read its input now)
    tl.extra.cuda.gdc_launch_dependents()  # after the wait, else launched kernels pile up waiting (layer_chain.py)
    acc = tl.sum(first.to(tl.float32), axis=0)
    for b in range(pid + PRE * nprog, (n + BLOCK - 1) // BLOCK, nprog):
        i = b * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + off + i, mask=i < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def _empty(out_ptr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def phases() -> list[tuple[int, int]]:
    """(rows, cols) of the 112 matrices in the order a decode step reads them."""
    return [(Q + 2 * KV, HIDDEN), (HIDDEN, Q), (2 * INTER, HIDDEN), (HIDDEN, INTER)] * LAYERS


def weight_chain(dev: torch.device) -> tuple[torch.Tensor, list[torch.Tensor], list[int], list[int]]:
    """The 112 matrices in one bf16 buffer (random, scale 0.02): the buffer, each matrix as a view, and each one's
    element offset and size."""
    shapes = phases()
    sizes = [r * c for r, c in shapes]
    offs = [sum(sizes[:i]) for i in range(len(sizes))]
    w = torch.randn(sum(sizes), device=dev, dtype=torch.bfloat16) * 0.02
    return w, [w[o : o + s].view(r, c) for o, s, (r, c) in zip(offs, sizes, shapes)], offs, sizes


def cublas_chain(mats: list[torch.Tensor], h: torch.Tensor) -> torch.Tensor:
    """The four projections of every layer as the engine's cuBLAS GEMMs at h's rows, each fed by the one before."""
    for i in range(0, len(mats), 4):
        qkv = F.linear(h, mats[i])
        gu = F.linear(F.linear(qkv[:, :Q], mats[i + 1]), mats[i + 2])
        h = F.linear(gu[:, :INTER], mats[i + 3])
    return h


def measure_read_rate(dev: torch.device) -> float:
    """Bytes per second of torch's `sum` over 2 GiB of bf16 (the floor's read rate), over five sums in a row."""
    big = torch.empty(1 << 30, device=dev, dtype=torch.bfloat16)
    big.sum()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        big.sum()
    b.record()
    torch.cuda.synchronize()
    return 5 * big.numel() * 2 / (a.elapsed_time(b) * 1e-3)


def resident_programs(kernel, num_warps: int) -> int:
    """Programs of `kernel` one SM holds at once, from its registers and shared memory (the barrier needs every
    program resident)."""
    props = torch.cuda.get_device_properties(0)
    threads = 32 * num_warps
    kernel._init_handles()  # loads the module; fills n_regs
    regs = max(kernel.n_regs, 1)
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (((regs + 7) // 8) * 8 * threads)
    by_threads = props.max_threads_per_multi_processor // threads
    shared = kernel.metadata.shared
    by_smem = props.shared_memory_per_multiprocessor // shared if shared else by_threads
    return max(1, min(by_regs, by_threads, by_smem))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="16,64,128,256", help="rows of the cuBLAS chains")
    ap.add_argument("--block", type=int, default=8192, help="bf16 elements a program reads per iteration")
    ap.add_argument("--per-sm", type=int, default=4, help="programs per SM asked for (capped at what stays resident)")
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--out", default="phase_boundaries.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bf = torch.bfloat16
    shapes = phases()
    w, mats, offs, sizes = weight_chain(dev)
    offs_t = torch.tensor(offs, device=dev, dtype=torch.int64)
    sizes_t = torch.tensor(sizes, device=dev, dtype=torch.int32)
    counter = torch.zeros(1, device=dev, dtype=torch.int32)
    flag = torch.zeros(1, device=dev, dtype=torch.int32)

    read_rate = measure_read_rate(dev)
    floor_ms = w.numel() * 2 / read_rate * 1e3

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kp = _persistent.warmup(
        w, offs_t, sizes_t, flag, counter, flag, 1, READ=True, PREFETCH=2, BLOCK=args.block, SPINS=SPIN_LIMIT,
        grid=(1,), num_warps=args.warps,
    )  # fmt: skip
    per_sm = min(args.per_sm, resident_programs(kp, args.warps))
    nprog = sms * per_sm
    print(f"{nprog} programs ({per_sm} per SM of {args.per_sm} asked, {kp.n_regs} registers)", flush=True)
    pdl = tuple(f"kernels-pdl{p}" for p in (1, 2, 4))
    streaming = ("kernels", "kernels-pf-next", *pdl, "persistent", "persistent-pf", "persistent-pf-early")
    out = {m: torch.zeros(len(shapes) * nprog, device=dev, dtype=torch.float32) for m in streaming}
    ms_rows = [int(v) for v in args.ms.split(",")]
    modes = [f"cublas-{m}" for m in ms_rows] + [*streaming, "empty", "empty-pdl", "barriers"]

    def step(mode: str, x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        if mode.startswith("cublas-"):
            return cublas_chain(mats, x[: int(mode.split("-")[1])])
        if mode in ("kernels", "kernels-pf-next"):
            for p, (o, s) in enumerate(zip(offs, sizes)):
                no, ns = (offs[p + 1], sizes[p + 1]) if p + 1 < len(offs) else (o, 0)
                _phase[(nprog,)](
                    w, o, s, no, ns, out[mode][p * nprog :],
                    PREFETCH=mode == "kernels-pf-next", BLOCK=args.block, num_warps=args.warps,
                )  # fmt: skip
            return out[mode]
        if mode in pdl:
            for p, (o, s) in enumerate(zip(offs, sizes)):
                _phase_pdl[(nprog,)](
                    w, o, s, out[mode][p * nprog :], PRE=int(mode[len("kernels-pdl") :]), BLOCK=args.block,
                    num_warps=args.warps, launch_pdl=True,
                )  # fmt: skip
            return out[mode]
        if mode in ("empty", "empty-pdl"):
            for _ in shapes:
                _empty[(nprog,)](flag, PDL=mode == "empty-pdl", launch_pdl=mode == "empty-pdl")
            return flag
        counter.zero_()
        read = mode != "barriers"
        _persistent[(nprog,)](
            w, offs_t, sizes_t, out.get(mode, flag), counter, flag, len(shapes),
            READ=read, PREFETCH={"persistent-pf": 1, "persistent-pf-early": 2}.get(mode, 0), BLOCK=args.block,
            SPINS=SPIN_LIMIT, num_warps=args.warps,
        )  # fmt: skip
        return out.get(mode, flag)

    x0 = torch.randn(max(ms_rows), HIDDEN, device=dev, dtype=bf)
    ms, outs = interleaved_step_ms(step, modes, x0, x0, rounds=15, skip=3)
    timed_out = int(flag.item())
    ref = outs["kernels"]
    same = {m: ((outs[m] - ref).abs().max() / ref.abs().max()).item() for m in streaming[1:]}
    boundaries = len(shapes) - 1
    row = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        block=args.block,
        warps=args.warps,
        programs=nprog,
        programs_per_sm=per_sm,
        regs=kp.n_regs,
        read_rate_tb_s=read_rate / 1e12,
        weight_mb=w.numel() * 2 / 1e6,
        floor_ms=floor_ms,
        ms=ms,
        us_per_layer={m: v * 1e3 / LAYERS for m, v in ms.items()},
        us_per_boundary={
            "kernels - persistent": (ms["kernels"] - ms["persistent"]) * 1e3 / boundaries,
            "empty kernel": ms["empty"] * 1e3 / len(shapes),
            "empty kernel, PDL": ms["empty-pdl"] * 1e3 / len(shapes),
            "barrier": ms["barriers"] * 1e3 / boundaries,
        },
        sums_max_rel_diff_vs_kernels=same,
        barrier_timeouts=timed_out,
    )
    print(f"{row['gpu']}: read rate {read_rate / 1e12:.2f} TB/s, floor {floor_ms:.3f} ms for {row['weight_mb']:.0f} MB")
    print(f"block {args.block}, {args.warps} warps")
    for m, v in ms.items():
        print(f"  {m:>14}: {v:7.3f} ms  {v * 1e3 / LAYERS:6.1f} us/layer  {v / floor_ms:5.2f}x floor")
    print("  us per boundary:", {k: round(v, 2) for k, v in row["us_per_boundary"].items()})
    print(f"  sums' largest difference from `kernels` (relative): {same}; barrier timeouts: {timed_out}")
    with open(args.out, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
