"""The engine's step loop, one for both places it runs: a process of its own under `serve` and `chat`
(engine_loop.EngineLoop, fed over ZeroMQ) and a thread of the benchmarks' process (async_llm.AsyncLLM, fed by a queue).
Commands are applied between steps; with nothing to do the loop waits for the next one, except under tensor
parallelism, where it steps even then so that the follower ranks stay in lockstep."""

from __future__ import annotations

import traceback

from engine.distributed import TP
from engine.gc_heap import collect_if_idle, frozen_heap


class StepLoop:
    """Subclasses say where commands come from (`_receive`), what a step sends out (`_step`), whether there is work
    (`_busy`) and when to stop (`_stopping`)."""

    IDLE_TICK = 0.5  # seconds: the longest wait for a command while idle (under TP, between idle steps)

    def __init__(self) -> None:
        self.error: str | None = None  # why the loop crashed

    def _busy(self) -> bool:
        raise NotImplementedError

    def _receive(self, block: bool) -> None:
        """Apply the commands that arrived; with `block`, first wait up to IDLE_TICK for one."""
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError

    def _stopping(self) -> bool:
        raise NotImplementedError

    def _run_steps(self) -> None:
        """Step until stopped. A crash of the loop itself ends it with `error` set (and the traceback printed) for the
        subclass to tell its requests, instead of raising."""
        try:
            with frozen_heap():
                while not self._stopping():
                    idle = not self._busy()
                    collect_if_idle(not idle)
                    self._receive(block=idle)
                    if self._stopping() or (not self._busy() and TP.size == 1):
                        continue
                    self._step()
        except Exception as e:
            self.error = f"engine loop crashed: {type(e).__name__}: {e}"
            traceback.print_exc()
