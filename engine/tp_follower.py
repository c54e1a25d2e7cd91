"""What ranks > 0 run under torchrun: the same engine steps as rank 0, driven by its broadcasts."""

from __future__ import annotations

import signal

from engine.llm import LLM


def run_tp_follower(llm: LLM) -> None:
    """Blocks until rank 0 shuts down. A dead or stuck peer surfaces in a step as a collective error or timeout
    (MINISGL_DIST_TIMEOUT seconds), and the step ends this process (`leave_failed_group`)."""
    # Ctrl-C reaches every rank under torchrun, and torchrun forwards the SIGTERM / SIGHUP it gets (`kill`, docker
    # stop, systemd, a closing terminal) to every rank too; only rank 0 acts on them (it broadcasts the shutdown), so
    # a follower leaving early cannot strand rank 0 inside a collective. (A follower that died on SIGTERM made rank 0
    # report "tensor-parallel group failed" and exit 1 on a plain stop.) torchrun SIGKILLs what is left after its
    # grace period, and a follower whose rank 0 is gone leaves at its next collective (leave_failed_group).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    llm.engine.run_follower()
