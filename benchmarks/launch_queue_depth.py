"""How much work the CPU can queue on a CUDA stream before a launch blocks: behind a long GPU sleep, launch tiny
kernels (or replays of a captured graph of tiny kernels) one by one and report how many went in before one took over
1 ms. Run once per setting of CUDA_SCALE_LAUNCH_QUEUES (it is read when CUDA starts): e.g.
    python benchmarks/launch_queue_depth.py; CUDA_SCALE_LAUNCH_QUEUES=4x python benchmarks/launch_queue_depth.py
"""

from __future__ import annotations

import json
import os
import time

import torch


def queued_before_block(launch: object, limit: int, sleep_cycles: int) -> tuple[int, float]:
    """Launches made before the first that took over 1 ms, and the time that one took (ms)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    for i in range(limit):
        t = time.perf_counter()
        launch()  # type: ignore[operator]
        dt = time.perf_counter() - t
        if dt > 1e-3:
            torch.cuda.synchronize()
            return i, 1e3 * dt
    torch.cuda.synchronize()
    return limit, 0.0


def main() -> None:
    x = torch.zeros(16, device="cuda")
    sleep_cycles = int(2e9)  # ~1 s at H100 clocks: far longer than queuing takes
    for _ in range(3):
        x.add_(1)
    kernels = 10
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for _ in range(kernels):
                x.add_(1)
    torch.cuda.synchronize()
    g.replay()
    result: dict[str, object] = {"CUDA_SCALE_LAUNCH_QUEUES": os.environ.get("CUDA_SCALE_LAUNCH_QUEUES", "")}
    result["kernels"] = queued_before_block(lambda: x.add_(1), 20000, sleep_cycles)
    result[f"graph_replays_of_{kernels}_kernels"] = queued_before_block(g.replay, 20000, sleep_cycles)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
