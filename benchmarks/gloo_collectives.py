"""CPU tensor parallelism's collectives on gloo: its all_reduce / all_gather against each rank sending its tensor to
every other (isend/irecv) and summing in rank order, what engine/distributed.py's TPContext does on CPUs.

torchrun --nproc-per-node 2 benchmarks/gloo_collectives.py [--rounds 300]
Shapes: a decode step's residual (6 rows of SmolLM2's 576), 256 and 1,024 rows, and 64 x 49,152 floats (12 MiB).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

SHAPES = ((6, 576), (256, 576), (1024, 576), (64, 49152))


def timed(name: str, f: Callable[[], None], rounds: int) -> None:
    for _ in range(10):
        f()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(rounds):
        f()
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks  {name:34s} {(time.perf_counter() - t) / rounds * 1e3:7.3f} ms")


def compare(shape: tuple[int, int], rounds: int) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.randn(shape)
    parts = [torch.empty_like(x) for _ in range(size)]

    def p2p() -> None:
        pending = []
        for r in range(size):
            if r != rank:
                pending += [dist.isend(x, r), dist.irecv(parts[r], r)]
        for w in pending:
            if w is not None:  # None only for a rank outside the group
                w.wait()

    def p2p_sum() -> None:
        p2p()
        parts[rank] = x
        total = parts[0].clone()
        for p in parts[1:]:
            total += p

    timed(f"gloo all_reduce {list(shape)}", lambda: dist.all_reduce(x), rounds)
    timed(f"isend/irecv + sum {list(shape)}", p2p_sum, rounds)
    timed(f"gloo all_gather {list(shape)}", lambda: dist.all_gather(parts, x), rounds)
    timed(f"isend/irecv {list(shape)}", p2p, rounds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    for shape in SHAPES:
        compare(shape, max(1, args.rounds // (1 + shape[0] * shape[1] // 100_000)))  # fewer rounds of the larger
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
