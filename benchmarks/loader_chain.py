"""Does a persistent kernel whose loader runs ahead of its grid barriers read a decode step's weights at the bytes
rate? The question a decode megakernel's case rests on (issue #17; GPU only):

    source .whl/use-bundle.sh && python benchmarks/loader_chain.py --out $OUT/loader_chain.json

phase_boundaries.py read Qwen3-0.6B's 112 projection matrices (881 MB, 28 layers) in phases, and found a grid
barrier dearer than a kernel boundary in Triton, where each phase's loads can only start once its barrier is passed.
Its best chain (kernels under programmatic dependent launch, each loading its weights before waiting for the kernel
before) ran 1.5x the bytes. Hand-written megakernels instead give loading to a warp of its own that streams the next
phase's weights while the others still wait at the barrier. benchmarks/loader_chain.cu does that, without
arithmetic in the way: one CTA per SM, a loader lane bringing the CTA's share of each matrix through a ring of
shared-memory stages with the copy engine, consumer warps summing each stage and passing a grid barrier between
matrices. Modes, each captured in one CUDA graph and replayed in turn (layer_chain.interleaved_step_ms):
- `runahead-cC-sS`: one launch for the 112 phases, C KB stages, S of them; the loader never waits for a barrier;
  each CTA reads an equal contiguous share of each matrix, or with `-i` every grid-th chunk (interleaved);
- `lockstep-cC-sS`: the same, the loader waiting until the consumers have passed the barrier before each matrix;
- `kernels-cC-sS`: the same kernel launched once per matrix (112 launches, no barrier);
- `stream-cC-sS`: one launch, no barriers at all: the loader's read rate alone;
- `barriers`: one launch with the 111 barriers and no reads;
- `cublas-M`: the engine's GEMMs for the four projections at M rows, chained (a reference from the same run).
The floor is the bytes at the read rate of torch's `sum` over 2 GiB (printed). Every mode's per-matrix sums must
agree with torch's sum of that matrix: the check that every byte was read once.
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import torch
from layer_chain import LAYERS, interleaved_step_ms
from phase_boundaries import cublas_chain, measure_read_rate, phases, weight_chain

from engine.cache_paths import cache_root
from kernels import cuda_build

SOURCE = Path(__file__).with_name("loader_chain.cu")
CONSUMER_WARPS = 4
MAX_STAGES = 16  # loader_chain.cu's


def library(barrier: str = "fence") -> ctypes.CDLL:
    """barrier: `fence` (fences around a returning atomicAdd, relaxed polls: the thirty-second session's) or `release`
    (a release reduction and acquire polls)."""
    flags = ("-DBARRIER_RELEASE",) if barrier == "release" else ()
    lib = cuda_build.build(SOURCE, cache_root() / "cuda", flags=flags)
    p, i32 = ctypes.c_void_p, ctypes.c_int
    lib.loader_chain_launch.argtypes = [p, p, p, i32, i32, p, p, p, i32, i32, i32, i32, i32, i32, i32, p]
    lib.loader_chain_launch.restype = i32
    return lib


def parse(mode: str) -> tuple[str, int, int, int]:
    """`runahead-c32-s6` -> ("runahead", 32768, 6, 0); `runahead-c8-s16-i` -> ("runahead", 8192, 16, 1)."""
    kind, c, s, *rest = mode.split("-")
    if int(s[1:]) > MAX_STAGES:
        raise SystemExit(f"{mode}: at most {MAX_STAGES} stages (loader_chain.cu's MAX_STAGES)")
    return kind, int(c[1:]) * 1024, int(s[1:]), int(rest == ["i"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rings", default="c32-s6,c16-s12,c32-s3,c64-s3", help="stage KB and stage count per ring")
    ap.add_argument("--ms", default="16,256", help="rows of the cuBLAS chains")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--barrier", choices=("fence", "release"), default="fence", help="library()'s barrier")
    ap.add_argument("--out", default="loader_chain.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    shapes = phases()
    w, mats, offs, sizes = weight_chain(dev)
    offs_b = torch.tensor([2 * o for o in offs], device=dev, dtype=torch.int64)
    sizes_b = torch.tensor([2 * s for s in sizes], device=dev, dtype=torch.int64)
    ref = torch.stack([m.float().sum() for m in mats])
    counter = torch.zeros(1, device=dev, dtype=torch.int32)
    flag = torch.zeros(1, device=dev, dtype=torch.int32)

    read_rate = measure_read_rate(dev)
    floor_ms = w.numel() * 2 / read_rate * 1e3

    lib = library(args.barrier)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rings = args.rings.split(",")
    cuda_modes = [f"{k}-{r}" for r in rings for k in ("runahead", "lockstep", "kernels", "stream")]
    out = {m: torch.zeros(len(shapes) * sms, device=dev, dtype=torch.float32) for m in [*cuda_modes, "barriers"]}
    ms_rows = [int(v) for v in args.ms.split(",")]
    modes = [f"cublas-{m}" for m in ms_rows] + cuda_modes + ["barriers"]

    def launch(
        first: int, n: int, dst: torch.Tensor, read: int, runahead: int, chunk: int, stages: int, interleave: int
    ) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        err = lib.loader_chain_launch(
            w.data_ptr(), offs_b.data_ptr(), sizes_b.data_ptr(), first, n, dst.data_ptr(), counter.data_ptr(),
            flag.data_ptr(), read, runahead, chunk, stages, interleave, CONSUMER_WARPS, sms, stream,
        )  # fmt: skip
        if err:
            raise RuntimeError(f"loader_chain_launch failed: {err}")

    def step(mode: str, x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        if mode.startswith("cublas-"):
            return cublas_chain(mats, x[: int(mode.split("-")[1])])
        if mode == "barriers":
            counter.zero_()
            launch(0, len(shapes), out[mode], 0, 1, 16, 1, 0)
            return out[mode]
        kind, chunk, stages, inter = parse(mode)
        if kind == "kernels":
            for p in range(len(shapes)):
                launch(p, 1, out[mode], 1, 1, chunk, stages, inter)
        else:
            counter.zero_()
            runahead = {"lockstep": 0, "runahead": 1, "stream": 2}[kind]
            launch(0, len(shapes), out[mode], 1, runahead, chunk, stages, inter)
        return out[mode]

    x0 = torch.randn(max(ms_rows), 1024, device=dev, dtype=torch.bfloat16)
    ms, outs = interleaved_step_ms(step, modes, x0, x0, rounds=args.rounds, skip=3)
    timed_out = int(flag.item())
    sums_err = {
        m: ((outs[m].view(len(shapes), sms).sum(1) - ref).abs().max() / ref.abs().max()).item() for m in cuda_modes
    }
    row = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        sms=sms,
        consumer_warps=CONSUMER_WARPS,
        read_rate_tb_s=read_rate / 1e12,
        weight_mb=w.numel() * 2 / 1e6,
        floor_ms=floor_ms,
        ms=ms,
        us_per_layer={m: v * 1e3 / LAYERS for m, v in ms.items()},
        barrier_us=ms["barriers"] * 1e3 / (len(shapes) - 1),
        sums_max_rel_err_vs_torch=sums_err,
        barrier_timeouts=timed_out,
    )
    print(f"{row['gpu']}: read rate {read_rate / 1e12:.2f} TB/s, floor {floor_ms:.3f} ms for {row['weight_mb']:.0f} MB")
    print(f"{sms} CTAs, a loader lane and {CONSUMER_WARPS} consumer warps each")
    for m, v in ms.items():
        print(f"  {m:>18}: {v:7.3f} ms  {v * 1e3 / LAYERS:6.1f} us/layer  {v / floor_ms:5.2f}x floor")
    print(f"  barrier: {row['barrier_us']:.2f} us; sums' largest error against torch's: {max(sums_err.values()):.2e}")
    print(f"  barrier timeouts: {timed_out}")
    with open(args.out, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
