"""A decode GEMM that loads its weights before it waits for its input, chained under programmatic dependent launch
(issue #17; GPU only):

    source .whl/use-bundle.sh && python benchmarks/resident_gemm.py --out $OUT/resident_gemm.json

Qwen3-0.6B's four projections (qkv, o, gate_up, down) for 28 layers with their own weights (881 MB: L2 holds none of
a matrix when its turn comes), chained as in a decode step at M rows, one CUDA graph per mode, replayed in turn:
- `cublas`: torch's GEMMs, the engine's kernels;
- `resident`: each program owns BN output columns and loads its whole [BN, K] slice of W (64-96 KB at the default
  `--bn`) in one go, then reads x in 16-row blocks (from L2: it is small at these M) and multiplies;
- `resident-pdl`: the same launched with PDL. The weight slice is loaded before `gdc_wait` (weights depend on no
  earlier kernel), so the next projection's programs, once launched, stream their weights while this one computes,
  and its programs let the next launch once their wait is over.
- `cuda[-pdl][-b16][-s2|-sall][-rot]`: the same idea in CUDA (`resident_gemm.cu`: W's slice in shared memory by
  cp.async before the wait, x streamed through shared memory, mma.sync), with or without PDL; `-b16` 16 rows per
  pass at every M (else 32 above 16 rows), `-s2` two stages of x instead of three, `-sall` a whole pass of x at
  once (16 rows), `-rot` each CTA starting at its own chunk of x (32-row passes, so above 16 rows only).
- `cutlass[-pdl]`, `cl64x64[-pdl]`, ...: `cutlass_gemm.cu`, CUTLASS 4.5 Hopper GEMMs (TMA, warp-specialized) built with
  GDC against the headers in FlashInfer's wheel, one library per configuration (`CUTLASS_CONFIGS`: tiles, clusters,
  ping-pong, stream-K, W and x swapped), without or with PDL (they wait before their first load, weights included);
- `cublaspf[2]`: cuBLAS, with a side branch of the graph asking L2 for the next (or the second next) GEMM's weights
  when each GEMM starts (`l2_prefetch.cu`), so the GEMM after it finds them there;
- `cublashot`: cuBLAS with every layer's weights the first layer's, so they sit in L2: the bound on what loading a
  GEMM's weights into L2 ahead of it could give.
The question: do kernel boundaries stop costing once the weights no longer wait for the input? (The streaming read
alone: `phase_boundaries.py`.) Outputs are checked against cuBLAS's, and each CUDA GEMM alone at 1 and 37 rows.
H100 (docs/gpu.md): PDL takes ~6 us per layer off. Up to 16 rows the CUDA chain under PDL is 17% faster than cuBLAS
(22.3-22.7 against 26.5-27.3 us per layer; the Triton one 25.1-26.5); beyond, every 16 rows cost 10-15 us more,
since every CTA reads all of x from L2 (cuBLAS's cluster kernels share it): 52.5 against 28.3 at 64 rows.
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from layer_chain import HIDDEN, INTER, KV, LAYERS, Q, interleaved_step_ms  # this script's folder is on sys.path


@triton.jit
def _dot_chunk(x_ptr, rm, M, sx, w, c: tl.constexpr, KC: tl.constexpr, acc):
    k = c * KC + tl.arange(0, KC)
    x = tl.load(x_ptr + rm[:, None] * sx + k[None, :], mask=rm[:, None] < M, other=0.0)
    return tl.dot(x, tl.trans(w), acc)


@triton.jit(do_not_specialize=["M"])  # specialized to M = 1 it compiled to a kernel 4x slower than at M = 16
def _resident_kernel(
    x_ptr, w_ptr, y_ptr, M, sx, sy,
    NK: tl.constexpr, KC: tl.constexpr, PDL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    """y[:, cols] = x W[cols]^T for this program's BN columns; K = NK * KC, NK <= 3 (W's slice in NK tensors)."""
    K: tl.constexpr = NK * KC
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    k = tl.arange(0, KC)
    w0 = tl.load(w_ptr + rn[:, None] * K + k[None, :])
    w1 = w0
    w2 = w0
    if NK > 1:
        w1 = tl.load(w_ptr + rn[:, None] * K + KC + k[None, :])
    if NK > 2:
        w2 = tl.load(w_ptr + rn[:, None] * K + 2 * KC + k[None, :])
    if PDL:
        tl.extra.cuda.gdc_wait()  # x, the previous kernel's output, is visible from here
        tl.extra.cuda.gdc_launch_dependents()  # after the wait, else launched kernels pile up waiting
    for m0 in range(0, M, BM):
        rm = m0 + tl.arange(0, BM)
        acc = _dot_chunk(x_ptr, rm, M, sx, w0, 0, KC, tl.zeros((BM, BN), tl.float32))
        if NK > 1:
            acc = _dot_chunk(x_ptr, rm, M, sx, w1, 1, KC, acc)
        if NK > 2:
            acc = _dot_chunk(x_ptr, rm, M, sx, w2, 2, KC, acc)
        tl.store(y_ptr + rm[:, None] * sy + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=rm[:, None] < M)


KC = 1024  # W's slice is loaded in chunks of this many columns (every K here is a multiple)
COMPILED: dict[tuple[int, int, bool], object] = {}  # (K, BN, PDL) -> Triton's compiled kernel


def resident_linear(x: torch.Tensor, w: torch.Tensor, bn: int, pdl: bool, warps: int) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    assert n % bn == 0 and k % KC == 0 and k // KC <= 3 and w.is_contiguous() and x.stride(1) == 1
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    COMPILED[(k, bn, pdl)] = _resident_kernel[(n // bn,)](
        x, w, y, m, x.stride(0), y.stride(0), NK=k // KC, KC=KC, PDL=pdl, BM=16, BN=bn, num_warps=warps, num_stages=1,
        launch_pdl=pdl,
    )  # fmt: skip
    return y


def cuda_ext():
    """benchmarks/resident_gemm.cu built with torch's extension builder (nvcc; ~1 min the first time)."""
    from torch.utils.cpp_extension import load

    src = Path(__file__).with_name("resident_gemm.cu")
    return load(name="resident_gemm_cuda", sources=[str(src)], extra_cuda_cflags=["-O3"], verbose=False)


# cutlass_gemm.cu's configurations by kind (its -D flags): tile rows x columns x depth, cluster, schedule (0
# warp-specialized, 1 ping-pong, 3 cooperative with stream-K), SWAP (y^T = W x^T: W's rows on the wide side)
CUTLASS_CONFIGS: dict[str, dict[str, int]] = {
    "cutlass": {},  # 64 x 128 x 64, clusters of 2, warp-specialized (the file's defaults)
    "cl64x64": dict(TM=64, TN=64, TK=128, CLN=1),
    "cl64x32": dict(TM=64, TN=32, TK=128, CLN=1),
    "clpp": dict(TM=64, TN=64, TK=128, CLN=1, SCHED=1),
    "clsk": dict(TM=128, TN=64, TK=64, CLN=1, SCHED=3),
    "clswap": dict(TM=64, TN=64, TK=128, CLN=1, SWAP=1),
    "clswapsk": dict(TM=128, TN=64, TK=64, CLN=1, SCHED=3, SWAP=1),
}


def cutlass_libs(names: list[str]) -> dict[str, ctypes.CDLL]:
    """benchmarks/cutlass_gemm.cu built by kernels/cuda_build.py (nvcc, ~40 s each the first time, in parallel) in each
    named configuration, against the CUTLASS headers FlashInfer's wheel carries."""
    from concurrent.futures import ThreadPoolExecutor

    import flashinfer

    from engine.cache_paths import cache_root
    from kernels import cuda_build

    include = Path(flashinfer.__file__).parent / "data" / "cutlass" / "include"
    src = Path(__file__).with_name("cutlass_gemm.cu")

    def build(name: str) -> ctypes.CDLL:
        defines = tuple(f"-D{k}={v}" for k, v in CUTLASS_CONFIGS[name].items())
        flags = (f"-I{include}", "-DCUTLASS_ENABLE_GDC_FOR_SM90", "-DNDEBUG", "--expt-relaxed-constexpr", *defines)
        lib = cuda_build.build(src, cache_root() / "cuda", torch.device("cuda"), flags)
        p, i32 = ctypes.c_void_p, ctypes.c_int
        lib.gemm_bf16.argtypes = [p, p, p, i32, i32, i32, ctypes.c_longlong, i32, p]
        lib.gemm_bf16.restype = i32
        return lib

    with ThreadPoolExecutor(max_workers=len(names) or 1) as pool:
        return dict(zip(names, pool.map(build, names)))


def prefetch_lib() -> ctypes.CDLL:
    """benchmarks/l2_prefetch.cu built by kernels/cuda_build.py (a few seconds)."""
    from engine.cache_paths import cache_root
    from kernels import cuda_build

    lib = cuda_build.build(Path(__file__).with_name("l2_prefetch.cu"), cache_root() / "cuda", torch.device("cuda"))
    lib.prefetch_l2.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_void_p]
    lib.prefetch_l2.restype = ctypes.c_int
    return lib


def cutlass_linear(lib: ctypes.CDLL, x: torch.Tensor, w: torch.Tensor, pdl: bool) -> torch.Tensor:
    """x [M, K] (rows may be strided) times w [N, K]^T through cutlass_gemm.cu, on torch's current stream."""
    (m, k), n = x.shape, w.shape[0]
    assert x.stride(1) == 1 and w.is_contiguous() and w.shape[1] == k and x.dtype == w.dtype == torch.bfloat16
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    rc = lib.gemm_bf16(x.data_ptr(), w.data_ptr(), y.data_ptr(), m, n, k, x.stride(0), int(pdl), stream)
    if rc:
        raise RuntimeError(f"cutlass_gemm.cu stopped at step {rc} on {m}x{n}x{k} (its gemm_bf16 says which)")
    return y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,16,32,64", help="rows")
    ap.add_argument("--bn", default="32,16,32,16", help="columns per program for qkv, o, gate_up, down")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--kinds", default="cublas,resident,resident-pdl,cuda,cuda-pdl")
    ap.add_argument("--out", default="resident_gemm.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    shapes = [(Q + 2 * KV, HIDDEN), (HIDDEN, Q), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
    # std 1/sqrt(K) keeps the activations O(1) through 112 GEMMs, so the outputs can be compared
    mats = [[torch.randn(n, k, device=dev).div_(k**0.5).bfloat16() for n, k in shapes] for _ in range(LAYERS)]
    bns = [int(v) for v in args.bn.split(",")]
    kinds = args.kinds.split(",")
    ext = cuda_ext() if any(k.startswith("cuda") for k in kinds) else None
    cls = cutlass_libs(sorted({k.split("-")[0] for k in kinds if k.split("-")[0] in CUTLASS_CONFIGS}))

    pf = prefetch_lib() if any(k.startswith("cublaspf") for k in kinds) else None
    side = torch.cuda.Stream()

    def chain_pf(h: torch.Tensor, dist: int) -> torch.Tensor:
        """The cuBLAS chain with the weights `dist` GEMMs ahead requested into L2 on a side stream as each starts."""
        assert pf is not None
        flat = [w for layer in mats for w in layer]
        main = torch.cuda.current_stream()

        def fetch(w: torch.Tensor) -> None:
            rc = pf.prefetch_l2(w.data_ptr(), w.numel() * w.element_size(), 32, side.cuda_stream)
            assert rc == 0, f"l2_prefetch.cu's launch failed ({rc})"

        side.wait_stream(main)
        with torch.cuda.stream(side):
            for w in flat[:dist]:
                fetch(w)
        for j, w in enumerate(flat):
            side.wait_stream(main)  # from the end of GEMM j - 1: runs beside GEMM j
            if j + dist < len(flat):
                with torch.cuda.stream(side):
                    fetch(flat[j + dist])
            h = F.linear(h, w)
            h = h[:, :Q] if j % 4 == 0 else h[:, :INTER] if j % 4 == 2 else h
        main.wait_stream(side)
        return h

    single_gemm_err = {}
    if ext is not None:  # each shape once against cuBLAS, at row counts that leave partial 16- and 32-row blocks
        for (n, k), w in zip(shapes, mats[0]):
            for m in (1, 37):
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                ref = F.linear(x, w).float()
                for bm in (16, 32):
                    got = ext.resident_linear(x, w, False, bm, 3, bm == 32).float()
                    single_gemm_err[f"{n}x{k} M={m} bm={bm}"] = ((got - ref).abs().max() / ref.abs().max()).item()
        print("one GEMM against cuBLAS (max rel. err.):", max(single_gemm_err.values()), flush=True)
    for name, cl in cls.items():  # the same for each CUTLASS GEMM, x strided as the chain slices it
        for (n, k), w in zip(shapes, mats[0]):
            for m in (1, 37, 256):
                x = torch.randn(m, 2 * k, device=dev, dtype=torch.bfloat16)[:, :k]
                ref = F.linear(x, w).float()
                got = cutlass_linear(cl, x, w, False).float()
                single_gemm_err[f"{name} {n}x{k} M={m}"] = ((got - ref).abs().max() / ref.abs().max()).item()
        print(f"one {name} GEMM against cuBLAS (max rel. err.):", max(single_gemm_err.values()), flush=True)

    def step(mode: str, x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        h = x[: int(mode.rsplit("-", 1)[1])]
        if mode.startswith("cublaspf"):
            return chain_pf(h, 2 if mode.startswith("cublaspf2") else 1)
        # `cublashot`: every layer with the first layer's weights, which stay in L2 (31.5 MB of its 50-60): the
        # chain as it would run were each GEMM's weights already in L2 when it starts
        for qkv_w, o_w, gu_w, down_w in [mats[0]] * LAYERS if mode.startswith("cublashot") else mats:
            if mode.startswith("cublas"):
                qkv = F.linear(h, qkv_w)
                gu = F.linear(F.linear(qkv[:, :Q], o_w), gu_w)
                h = F.linear(gu[:, :INTER], down_w)
            elif mode.split("-")[0] in cls:
                cl, pdl = cls[mode.split("-")[0]], "-pdl" in mode
                qkv = cutlass_linear(cl, h, qkv_w, pdl)
                gu = cutlass_linear(cl, cutlass_linear(cl, qkv[:, :Q], o_w, pdl), gu_w, pdl)
                h = cutlass_linear(cl, gu[:, :INTER], down_w, pdl)
            elif mode.startswith("cuda"):
                assert ext is not None
                # cuda[-pdl][-b16][-s2|-sall][-rot]: PDL; 16 rows per pass at every M (less shared memory); 2
                # stages, not 3, or a whole pass's x at once (16 rows); each CTA starting at its own chunk of x
                # (built for 32-row passes and 3 stages: at 16 rows or fewer the mode runs without it)
                pdl = "-pdl" in mode
                stages = 2 if "-s2" in mode else 0 if "-sall" in mode else 3
                bm = 16 if h.shape[0] <= 16 or "-b16" in mode or stages == 0 else 32
                rot = "-rot" in mode and bm == 32 and stages == 3
                qkv = ext.resident_linear(h, qkv_w, pdl, bm, stages, rot)
                o = ext.resident_linear(qkv[:, :Q], o_w, pdl, bm, stages, rot)
                gu = ext.resident_linear(o, gu_w, pdl, bm, stages, rot)
                h = ext.resident_linear(gu[:, :INTER], down_w, pdl, bm, stages, rot)
            else:
                pdl, wp = mode.startswith("resident-pdl"), args.warps
                qkv = resident_linear(h, qkv_w, bns[0], pdl, wp)
                gu = resident_linear(resident_linear(qkv[:, :Q], o_w, bns[1], pdl, wp), gu_w, bns[2], pdl, wp)
                h = resident_linear(gu[:, :INTER], down_w, bns[3], pdl, wp)
        return h

    ms_rows = [int(v) for v in args.ms.split(",")]
    modes = [f"{kind}-{m}" for m in ms_rows for kind in kinds]
    x0 = torch.randn(max(ms_rows), HIDDEN, device=dev, dtype=torch.bfloat16)
    ms, outs = interleaved_step_ms(step, modes, x0, x0, rounds=15, skip=3)
    rows = []
    for m in ms_rows:
        ref = outs[f"cublas-{m}"]
        row: dict[str, float] = {"m": m}
        for kind in kinds:
            row[f"{kind}_us_per_layer"] = ms[f"{kind}-{m}"] * 1e3 / LAYERS
            row[f"{kind}_rel_err"] = ((outs[f"{kind}-{m}"] - ref).abs().max() / ref.abs().max()).item()
        rows.append(row)
        cells = [f"{k} {row[f'{k}_us_per_layer']:6.1f} ({row[f'{k}_rel_err']:.1e})" for k in kinds]
        print(f"M={m:4d} us/layer (rel. err.):", ", ".join(cells), flush=True)
    result = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        bn=bns,
        warps=args.warps,
        single_gemm_rel_err=single_gemm_err,
        kernels={
            str(key): dict(regs=k.n_regs, spills=k.n_spills, shared=k.metadata.shared)  # type: ignore[attr-defined]
            for key, k in COMPILED.items()
        },
        rows=rows,
    )
    print("compiled (K, BN, PDL):", result["kernels"])
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
