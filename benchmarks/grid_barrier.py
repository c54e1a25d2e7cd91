"""What a grid-wide barrier costs on a persistent grid of one CTA per SM, four ways, against a kernel boundary in a
CUDA graph (GPU; issue #17's step 3). Run there:

    source .whl/use-bundle.sh && python benchmarks/grid_barrier.py --out $OUT/grid_barrier.json

A decode megakernel needs a grid-wide wait between a layer's phases (each projection's output column needs the whole
input row). The thirty-second session's loader chain paid 1.8 us per barrier on an H100 (one counter every CTA adds to
and polls), as much as most of the layer's matrices take to read, and that closed the route at that cost. This asks
whether a barrier can be much cheaper: grid_barrier.cu's modes (`counter`, the thirty-second session's; `flags`, a
flag per CTA polled by every CTA's threads; `cluster-N`, clusters of N CTAs meeting at the hardware cluster barrier
around one arrival per cluster; `cg`, cooperative groups' grid.sync()), each `--rounds` barriers in one launch, us per
barrier as the median of `--repeats` launches; and `kernel`, an empty kernel of the same grid launched `--rounds`
times from one CUDA graph, us per launch.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
from pathlib import Path

import torch

from engine.cache_paths import cache_root
from kernels import cuda_build

SOURCE = Path(__file__).resolve().parent / "grid_barrier.cu"
MODES = {"counter": 0, "flags": 1, "cluster": 2, "cg": 3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lib = cuda_build.build(SOURCE, cache_root() / "cuda")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    stream = torch.cuda.current_stream()
    results = []

    def timed(launch) -> float:
        times = []
        for _ in range(args.repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            launch()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / args.rounds)
        return statistics.median(times)

    cases: list[tuple[str, int, int]] = [("counter", sms, 1), ("flags", sms, 1), ("cg", sms, 1)]
    for c in (2, 4):
        most = lib.max_active_clusters(c, args.threads)
        ctas = min(sms // c, most) * c
        cases.append((f"cluster-{c}", ctas, c))
    for name, ctas, cluster in cases:
        mode = MODES[name.split("-")[0]]
        counter = torch.zeros(1, dtype=torch.int32, device=dev)
        flags = torch.zeros(ctas, dtype=torch.int32, device=dev)

        def launch(mode=mode, ctas=ctas, cluster=cluster, counter=counter, flags=flags, name=name) -> None:
            counter.zero_()
            flags.zero_()
            rc = lib.barrier_launch(mode, ctas, cluster, args.threads, args.rounds, ctypes.c_void_p(counter.data_ptr()),
                                    ctypes.c_void_p(flags.data_ptr()), ctypes.c_void_p(stream.cuda_stream))  # fmt: skip
            assert rc == 0, f"{name}: cudaError {rc}"

        launch()  # warm-up (and the check that the grid is resident: a deadlock would hang here)
        torch.cuda.synchronize()
        us = timed(launch)
        results.append(dict(mode=name, ctas=ctas, cluster=cluster, us_per_barrier=round(us, 3)))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for _ in range(args.rounds):
            assert lib.empty_launch(sms, args.threads, s) == 0
    g.replay()
    torch.cuda.synchronize()
    results.append(dict(mode="kernel", ctas=sms, cluster=1, us_per_barrier=round(timed(g.replay), 3)))
    print(f"{torch.cuda.get_device_name()}, {args.threads} threads per CTA, {args.rounds} rounds per launch")
    for r in results:
        print(f"{r['mode']:<10} {r['ctas']:>4} CTAs  {r['us_per_barrier']:>7.3f} us per barrier")
    if args.out:
        args.out.write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), results=results), indent=1))


if __name__ == "__main__":
    main()
