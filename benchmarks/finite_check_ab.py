"""What the load-time check for NaN / infinite weights costs (engine/models/llama.py `_finite`), CPU

    python benchmarks/finite_check_ab.py --loads 15 --paths cache,gguf

Loads the embedded SmolLM2-135M (fp32, CPU) again and again in one process, the check switched between `none` (no
check), `sum` (the one load_weights runs: a float32 sum per tensor, the exact test only when it is not finite) and
`isfinite` (`torch.isfinite(t).all()` per tensor), interleaved so that the machine's load falls on all three alike.
`cache`: from the weight cache's converted copy (stored by a first load); `gguf`: reading the GGUF (cache off).
Project's shared 2-core CPU, two runs of 15 cache loads: median 0.817 / 0.736 s none, 0.840 / 0.737 s sum,
1.121 / 1.024 s isfinite; 4 GGUF loads: 8.35 s none, 8.36 s sum (docs/reliability.md)."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from engine import loader
from engine.models import llama

MODES = {"none": lambda t: True, "sum": llama._finite, "isfinite": lambda t: bool(torch.isfinite(t).all())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loads", type=int, default=15, help="loads per mode")
    ap.add_argument("--paths", default="cache", help="cache, gguf or both (comma separated)")
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    os.environ.setdefault("MINISGL_CACHE_DIR", tempfile.mkdtemp(prefix="minisgl-finite-ab-"))
    modes = {m: MODES[m] for m in args.modes.split(",")}
    for path in args.paths.split(","):
        os.environ["MINISGL_WEIGHT_CACHE"] = "0" if path == "gguf" else "1"
        loader.load_model(None, torch.device("cpu"), torch.float32)  # warm-up (and the cache entry)
        times: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.loads):
            for m, check in modes.items():
                llama._finite = check  # the A/B switch
                t0 = time.perf_counter()
                loader.load_model(None, torch.device("cpu"), torch.float32)
                times[m].append(time.perf_counter() - t0)
        llama._finite = MODES["sum"]
        for m, ts in times.items():
            print(f"{path:5} {m:8} median {statistics.median(ts):.3f} s  best {min(ts):.3f} s  ({len(ts)} loads)")


if __name__ == "__main__":
    main()
