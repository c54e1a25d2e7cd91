"""The step log: one record per processed engine step (bench-trace --step-log, serve --step-log), as JSON lines that
benchmarks/step_log_summary.py reads."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One processed step, for schedule analysis (bench-trace --step-log): when its tokens reached the CPU, what it
    carried, and the KV its attention read (every row's context)."""

    t: float  # time.perf_counter() when its tokens were processed
    decode_rows: int
    prefill_rows: int
    prefill_tokens: int
    context_tokens: int
    # CPU milliseconds of the engine step that processed it (under overlap, that step also launched the next batch)
    schedule_ms: float
    launch_ms: float
    wait_ms: float  # blocked on the GPU for these tokens
    process_ms: float
    # CUDA: device allocations (cudaMalloc) and allocation retries (the caching allocator freed its cache and tried
    # again, which synchronizes the device) since the previous record
    device_allocs: int = 0
    alloc_retries: int = 0
    # the engine thread's CPU time in the launch: far below launch_ms, the thread waited (for the GIL, or in a
    # blocking call) rather than worked
    launch_cpu_ms: float = 0.0
    # the engine thread's context switches since the previous record (Linux): voluntary, it blocked (the GIL, a
    # blocking call, an idle wait for work); involuntary, the OS gave its core to another thread
    voluntary_switches: int = 0
    involuntary_switches: int = 0
    # what the attention did apart: the decode rows' context and the prefill rows' query-key pairs (Batch's properties)
    decode_context_tokens: int = 0
    prefill_key_pairs: int = 0


def write_step_log(records: list[StepRecord], path: str | Path) -> None:
    """One JSON line per step (bench-trace --step-log, serve --step-log; benchmarks/step_log_summary.py reads it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # as --json's: the up-front check lets a missing parent pass
    with open(path, "w") as f:
        f.writelines(json.dumps(asdict(rec)) + "\n" for rec in records)
