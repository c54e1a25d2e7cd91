"""Python's cyclic garbage collector, kept out of the way of the loops that stream tokens: the engine's step loop,
serve's HTTP front end and the benchmarks' client (minisgl_cli/replay.py drive). Each full pass stops every stream
that process carries."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# The oldest generation's threshold while any of those loops runs: its automatic (full) collections never come due.
FULL_COLLECTIONS_OFF = 1 << 30
_loops = 0  # loops running in this process (each enters frozen_heap once: an engine thread, a front end, a client)
_saved_threshold: tuple[int, int, int] | None = None
_lock = threading.Lock()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Move everything alive now (torch, the model, the interpreter's imports: hundreds of thousands of objects)
    out of the collector's reach while a step loop runs, so a full collection only walks what the loop created.
    Such collections stalled every running stream for up to ~200 ms on the H200 replay (max inter-token gap 191 ms
    with the collector on, 83 ms with it off; docs/scheduling.md). Objects frozen here that die in a reference cycle
    later are only reclaimed after the loop, at unfreeze.

    While a loop runs, full collections only come when it asks (`collect_if_idle`, when it has nothing to do): what the
    loop created still adds up (a saturated replay's requests hold millions of token ids), and on an H100 a full
    collection came every 133 steps and held every stream for 40-60 ms. Young collections keep running, so cycles
    that die young are still freed at once."""
    global _loops, _saved_threshold
    gc.collect()
    with _lock:
        gc.freeze()
        if _loops == 0:
            _saved_threshold = gc.get_threshold()
            gc.set_threshold(_saved_threshold[0], _saved_threshold[1], FULL_COLLECTIONS_OFF)
        _loops += 1
    try:
        yield
    finally:
        with _lock:
            _loops -= 1
            if _loops == 0:
                assert _saved_threshold is not None
                gc.set_threshold(*_saved_threshold)
                gc.unfreeze()


def collect_if_idle(has_work: bool) -> None:
    """A loop inside frozen_heap calls this once per turn (the front end every IDLE_CHECK_S): with nothing to do, it
    runs the full collection frozen_heap holds back, if its count has made one due (as many young collections since
    the last full one as the oldest generation's threshold before the loop), and only while no stream waits."""
    due_after = _saved_threshold[2] if _saved_threshold is not None else gc.get_threshold()[2]
    if not has_work and gc.get_count()[2] >= due_after:
        gc.collect()


@contextmanager
def paused_collector() -> Iterator[None]:
    """No cyclic collection while a bounded loop runs (one offline generate()). In the H100 offline workload's 7 s
    the collector otherwise ran ~250 gen-0 passes over the step's young outputs (~0.2 s of CPU) and, in 4 of 6 runs,
    one full collection of 137-201 ms, with the GPU idle behind it. Reference counting still frees everything
    acyclic; cycles made meanwhile wait for the next collection after the loop (the engine's steps make none: a
    test checks it, so a long offline run does not grow)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
