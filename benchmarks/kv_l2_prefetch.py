"""The next attention's first KV pages asked into L2 while the GEMMs before it run (GPU; issue #17). Run there:

    source .whl/use-bundle.sh && python benchmarks/kv_l2_prefetch.py --out $OUT/kv_l2_prefetch.json

A decode step alternates two phases per layer: the attention, which reads its KV at the memory's rate, and the GEMM
phase between two attentions (o, gate_up, down, the next qkv: ~25-35 us on an H200), which is latency-bound and
leaves most of the bandwidth idle. Every page brought into L2 during the GEMM phase is bytes the attention need not
read from HBM: at ~4.3 TB/s, 24 MB would be ~5.6 us off each attention, ~3% of the offline run. Whether that
survives the GEMMs' own traffic, L2's size (50 MB, the GEMMs' 30 MB of weights streaming through it) and its two
halves is what this measures.

One layer of Qwen3-0.6B's paged KV at the offline workload's lengths (each request's pages in runs of 8 ids, as the
engine allocates them), the engine's CUDA decode (as its graphs run it, no split), and before it the GEMM phase at
the same rows (four cuBLAS GEMMs at the projections' shapes). Each variant is one CUDA graph: the GEMMs, then the
attention; `pf-<mode>-<MB>` forks a side stream at the start that asks L2 for the first MB of the attention's pages
(in the order its CTAs take them; kv_l2_prefetch.cu) with plain priority (`norm`) or L2::evict_last (`last`);
`-clean` sets the prefetched lines back to evict_normal after the attention (so evict_last lines do not stay);
`inline-last-<MB>` launches it on the GEMMs' stream between gate_up and down; `sleep-last-<MB>` has no GEMMs: the
prefetch, a ~30 us spin, then the attention, against `sleep` (the spin, then the attention), which asks whether the
attention reads the prefetched lines from L2 at all. Each
replay follows an L2 flush (a 1 GiB read, then every prefetched line set back to normal), timed alone with CUDA
events; the table gives the median us per replay and the change against `base` (the same graph without the fork).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from engine.cache_paths import cache_root
from kernels import cuda_build

DIM, PAGE, HEADS, KV_HEADS, HIDDEN, INTER = 128, 16, 16, 8, 1024, 3072
SOURCE = Path(__file__).resolve().parent / "kv_l2_prefetch.cu"
MODES = {"norm": 0, "last": 1}


def offline_batch(rows: int, g: torch.Generator) -> tuple[list[int], list[int], int]:
    """Context lengths at the offline workload's (prompt 100-1024 plus 0-1024 generated), each request's pages in
    runs of 8 consecutive ids scattered over a pool 1.25x their total: (lens, pages in request order, pool pages)."""
    lens = (torch.randint(100, 1025, (rows,), generator=g) + torch.randint(0, 1025, (rows,), generator=g)).tolist()
    per = [-(-n // PAGE) for n in lens]
    runs = sum(-(-p // 8) for p in per)
    pool_runs = int(runs * 1.25) + 1
    order = torch.randperm(pool_runs, generator=g).tolist()
    pages: list[int] = []
    k = 0
    for p in per:
        for a in range(0, p, 8):
            pages += range(order[k] * 8, order[k] * 8 + min(8, p - a))
            k += 1
    return lens, pages, pool_runs * 8


def median_replay_us(g: torch.cuda.CUDAGraph, flush: Callable[[], None], iters: int) -> float:
    times = []
    for _ in range(iters):
        flush()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def case(rows: int, sizes_mb: list[int], iters: int, lib: ctypes.CDLL) -> list[dict]:
    from kernels.attention import cuda_decode
    from kernels.attention.flashinfer_backend import CUDA_PROGRAMS_PER_SM
    from kernels.attention.span_decode import SpanDecodeWrapper, SpanScratch

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(rows)
    lens, pages, pool_pages = offline_batch(rows, g)
    k = torch.randn(pool_pages, PAGE, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(rows, HEADS, DIM, device=dev, dtype=torch.bfloat16)
    indptr = torch.zeros(rows + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor([-(-n // PAGE) for n in lens], dtype=torch.int32).cumsum(0)
    indices = torch.tensor(pages, dtype=torch.int32, device=dev)
    last = torch.tensor([(n - 1) % PAGE + 1 for n in lens], dtype=torch.int32)
    if why := cuda_decode.load(cache_root() / "cuda", dev):
        raise RuntimeError(why)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    w = SpanDecodeWrapper(CUDA_PROGRAMS_PER_SM * sms, SpanScratch(dev), kernel="cuda")
    split = 2 * rows * KV_HEADS <= sms  # the engine's rule (flashinfer_backend.cuda_decode_split), offline lengths
    w.plan(indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, sm_scale=DIM**-0.5, disable_split_kv=not split)
    out = torch.empty_like(q)

    def attention() -> None:
        cuda_decode.decode(q, k, v, w.indptr, w.indices, w.work, w.work_ptr, w.sm_scale, w.part, w.lse, out,
                           heads_together=True)  # fmt: skip

    # the GEMM phase at these rows: o, gate_up, down, the next layer's qkv (SiLU and the fused kernel left out)
    wo = torch.randn(HIDDEN, HEADS * DIM, device=dev, dtype=torch.bfloat16) * 0.02
    wgu = torch.randn(2 * INTER, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.02
    wd = torch.randn(HIDDEN, INTER, device=dev, dtype=torch.bfloat16) * 0.02
    wqkv = torch.randn((HEADS + 2 * KV_HEADS) * DIM, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.02

    def gemms(inline: Callable[[], None] | None = None) -> None:
        h = out.view(rows, -1) @ wo.t()
        gu = h @ wgu.t()
        if inline is not None:  # the prefetch on the GEMMs' own stream, between gate_up and down
            inline()
        d = gu[:, :INTER] @ wd.t()
        torch.mm(d, wqkv.t())

    page_bytes = k[0].numel() * k.element_size()
    side = torch.cuda.Stream()

    def prefetch(n_pages: int, mode: int) -> None:
        ctas, threads = (8, 64) if mode < 2 else (264, 256)  # the cleanup: one thread per 128-byte line
        ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (k, v, indices)]
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = lib.kv_prefetch_launch(*ptrs, n_pages, page_bytes, mode, ctas, threads, stream)
        assert rc == 0, rc

    flush_buf = torch.empty(2**30, dtype=torch.uint8, device=dev)

    def flush() -> None:
        flush_buf.sum(dtype=torch.int64)
        prefetch(len(pages), 2)  # every line of the pool back to normal priority

    sleep_cycles = 60_000  # ~30 us at the H200's 1.98 GHz

    def build(n_pages: int, mode: int, clean: bool, how: str = "side") -> torch.cuda.CUDAGraph:
        """how: `side` (a forked stream beside the GEMMs), `inline` (between gate_up and down), `sleep` (no GEMMs:
        the prefetch, a ~30 us spin, then the attention: whether the attention reads the prefetched lines from L2)."""
        for _ in range(2):  # warm-up: cuBLAS's kernels loaded before capture
            gemms()
            attention()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            if how == "sleep":
                if n_pages:
                    prefetch(n_pages, mode)
                torch.cuda._sleep(sleep_cycles)
            elif how == "inline":
                gemms(lambda: prefetch(n_pages, mode))
            else:
                if n_pages:
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        prefetch(n_pages, mode)
                gemms()
                if n_pages:
                    torch.cuda.current_stream().wait_stream(side)
            attention()
            if n_pages and clean:
                prefetch(n_pages, 2)
        return graph

    kv_mb = len(pages) * 2 * page_bytes / 1e6
    variants: list[tuple[str, int, int, bool, str]] = [("base", 0, 0, False, "side"), ("sleep", 0, 0, False, "sleep")]
    for mb in sizes_mb:
        n = min(len(pages), int(mb * 1e6 // (2 * page_bytes)))
        variants += [
            (f"pf-norm-{mb}", n, 0, False, "side"),
            (f"pf-last-{mb}", n, 1, False, "side"),
            (f"pf-last-{mb}-clean", n, 1, True, "side"),
            (f"inline-last-{mb}", n, 1, False, "inline"),
            (f"sleep-last-{mb}", n, 1, False, "sleep"),
        ]
    variants.append(("base-again", 0, 0, False, "side"))
    graphs = {name: build(n, mode, clean, how) for name, n, mode, clean, how in variants}
    # the parts alone, for scale
    ga, gg = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(ga):
        attention()
    with torch.cuda.graph(gg):
        gemms()
    res = []
    rounds: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(3):  # interleaved rounds, so a drift of the machine falls on every variant alike
        for name, graph in graphs.items():
            rounds[name].append(median_replay_us(graph, flush, iters))
    base = statistics.median(rounds["base"])
    sleep_base = statistics.median(rounds["sleep"])
    attn_us, gemm_us = median_replay_us(ga, flush, iters), median_replay_us(gg, flush, iters)
    for name, n, *_ in variants:
        us = statistics.median(rounds[name])
        res.append(dict(rows=rows, variant=name, prefetch_mb=round(n * 2 * page_bytes / 1e6, 1), us=round(us, 2),
                        rounds=[round(x, 2) for x in rounds[name]],
                        vs_base_us=round(us - (sleep_base if name.startswith("sleep") else base), 2),
                        attention_alone_us=round(attn_us, 2), gemms_alone_us=round(gemm_us, 2),
                        kv_mb=round(kv_mb, 1)))  # fmt: skip
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="256,128,64,16")
    ap.add_argument("--mb", default="8,16,24,32,48", help="MB of KV asked into L2 (K and V together)")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lib = cuda_build.build(SOURCE, cache_root() / "cuda")
    lib.kv_prefetch_launch.restype = ctypes.c_int
    rows = [int(x) for x in args.rows.split(",")]
    sizes = [int(x) for x in args.mb.split(",")]
    results = []
    for r in rows:
        results += case(r, sizes, args.iters, lib)
        torch.cuda.empty_cache()
    print(f"{torch.cuda.get_device_name()}, us per replay (median of 3 rounds of {args.iters} replays after a flush)")
    print(f"{'rows':>5} {'variant':<18} {'MB':>6} {'us':>9} {'vs base':>9}   attention alone / GEMMs alone / KV MB")
    for x in results:
        print(f"{x['rows']:>5} {x['variant']:<18} {x['prefetch_mb']:>6} {x['us']:>9.2f} {x['vs_base_us']:>+9.2f}   "
              f"{x['attention_alone_us']} / {x['gemms_alone_us']} / {x['kv_mb']}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                                            results=results), indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
