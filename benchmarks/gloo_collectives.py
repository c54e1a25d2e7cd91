"""CPU tensor parallelism's collectives: engine/distributed.py's TPContext with gloo's all_reduce / all_gather
(`p2p=False`) against its isend/irecv exchange with every rank, summed in rank order (`p2p=True`, at every size here:
the engine takes gloo's all_reduce above `p2p_max_bytes`).

torchrun --nproc-per-node 2 benchmarks/gloo_collectives.py [--rounds 300]
Shapes: a decode step's residual (6 rows of SmolLM2's 576), 256 and 1,024 rows, and 64 x 49,152 floats (12 MiB).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist

from engine.distributed import TPContext

SHAPES = ((6, 576), (256, 576), (1024, 576), (64, 49152))


def timed(name: str, f: Callable[[], object], rounds: int) -> None:
    for _ in range(10):
        f()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(rounds):
        f()
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks  {name:34s} {(time.perf_counter() - t) / rounds * 1e3:7.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = TPContext(rank, size, p2p=False)
    p2p = TPContext(rank, size, p2p=True, p2p_max_bytes=1 << 62)
    for shape in SHAPES:
        rounds = max(1, args.rounds // (1 + shape[0] * shape[1] // 100_000))  # fewer rounds of the larger
        x = torch.randn(shape)
        timed(f"gloo all_reduce {list(shape)}", partial(gloo.all_reduce, x), rounds)
        timed(f"isend/irecv + sum {list(shape)}", partial(p2p.all_reduce, x), rounds)
        timed(f"gloo all_gather {list(shape)}", partial(gloo.all_gather_last_dim, x), rounds)
        timed(f"isend/irecv gather {list(shape)}", partial(p2p.all_gather_last_dim, x), rounds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
