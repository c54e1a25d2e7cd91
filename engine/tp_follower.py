"""What ranks > 0 run under torchrun: the same engine steps as rank 0, driven by its broadcasts."""

from __future__ import annotations

import signal

from engine.llm import LLM


def run_tp_follower(llm: LLM) -> None:
    """Blocks until rank 0 shuts down. A dead or stuck peer surfaces in a step as a collective error or timeout
    (MINISGL_DIST_TIMEOUT seconds), and the step ends this process (`leave_failed_group`)."""
    # Ctrl-C reaches every rank under torchrun; only rank 0 acts on it (it broadcasts the shutdown), so a
    # follower leaving early cannot strand rank 0 inside a collective.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    llm.engine.run_follower()
