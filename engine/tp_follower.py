"""What ranks > 0 run under torchrun: the same engine steps as rank 0, driven by its broadcasts."""
from __future__ import annotations

import signal
import sys

from engine.distributed import TP
from engine.llm import LLM


def run_tp_follower(llm: LLM) -> None:
    """Blocks until rank 0 shuts down. A dead or stuck peer surfaces here as a collective error or timeout
    (MINISGL_DIST_TIMEOUT seconds); we exit non-zero so torchrun tears the whole group down."""
    # Ctrl-C reaches every rank under torchrun; only rank 0 acts on it (it broadcasts the shutdown), so a
    # follower leaving early cannot strand rank 0 inside a collective.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        llm.engine.run_follower()
    except Exception as e:
        print(f"minisgl: rank {TP.rank}: tensor-parallel group failed ({type(e).__name__}: {e}); exiting",
              file=sys.stderr, flush=True)
        raise SystemExit(1) from e
