"""One line per `bench-trace --json` result: output rate, TTFT p50, TBT p50/p90/p99/max, mixed-step share and cache
hit rate, for the GPU scripts that compare replays. Usage: python benchmarks/trace_line.py result.json LABEL"""

from __future__ import annotations

import json
import sys


def line(r: dict, label: str) -> str:
    return (
        f"{label:12} out {r['output_throughput']:7.0f} tok/s  TTFT p50 {r['median_ttft_ms']:7.0f} ms  "
        f"TBT p50/p90/p99/max {r['median_itl_ms']:5.1f} {r['p90_itl_ms']:5.1f} {r['p99_itl_ms']:5.1f} "
        f"{r['max_itl_ms']:6.1f} ms  mixed {r['mixed_step_share']:.2f}  hit {r['cache_hit_rate']:.3f}"
    )


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(line(json.load(f), sys.argv[2]))
