"""Ending a child process: the one way every command that starts one (serve's front end, the mock server) does it."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM, `grace` seconds to exit, then SIGKILL; reaped either way (a no-op once it has exited)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
