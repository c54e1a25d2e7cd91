"""Does a host->device copy with non_blocking=True wait for the GPU? Queue ~50 ms of GPU work, then time (on the
CPU) the copy call for a pageable and a pinned source of several sizes. Under overlap scheduling the engine issues
these copies while the previous step still runs, so a copy call that blocks costs the GPU's remaining step time.
H200 (25c5c49, benchmarks/results/h2d_sync_check_h200_25c5c49.json): up to 1 MiB neither source blocks (0.05-0.22 ms);
at 4 MiB the pageable copy waited out the queued GPU work (25.7 ms), the pinned one did not (0.11 ms).
Usage (GPU): python benchmarks/h2d_sync_check.py [--json out.json]"""

from __future__ import annotations

import json
import sys
import time

import torch


def timed_copy(n_bytes: int, pinned: bool, dev: torch.device) -> float:
    src = torch.arange(n_bytes // 4, dtype=torch.int32)
    if pinned:
        src = src.pin_memory()
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # ~25-50 ms of GPU time at 1-2 GHz
    t = time.perf_counter()
    out = src.to(dev, non_blocking=True)
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), src)
    return dt * 1e3


def main() -> None:
    dev = torch.device("cuda")
    torch.cuda._sleep(1000)
    rows = []
    for kb in (1, 16, 64, 65, 128, 256, 1024, 4096):
        for pinned in (False, True):
            ms = min(timed_copy(kb * 1024, pinned, dev) for _ in range(3))
            rows.append({"kib": kb, "pinned": pinned, "copy_call_ms": ms})
            print(f"{kb:5} KiB {'pinned  ' if pinned else 'pageable'}: the copy call took {ms:7.3f} ms")
    torch.cuda.synchronize()
    t = time.perf_counter()
    torch.cuda._sleep(50_000_000)
    torch.cuda.synchronize()
    print(f"(the queued GPU work took {1e3 * (time.perf_counter() - t):.1f} ms)")
    if "--json" in sys.argv:
        env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
        json.dump({"env": env, "rows": rows}, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)


if __name__ == "__main__":
    main()
