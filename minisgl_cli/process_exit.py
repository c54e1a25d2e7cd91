"""A command's process ends without the interpreter's teardown. Once a command has returned, Python's finalization
frees every module's objects with several full collections in between: with torch imported that alone took 0.55-0.6 s
on a 2-core CPU machine (from the last atexit handler to the process's end, `import torch` and nothing else), after
the command's work and output were done. A Ctrl-C'd `serve` or a finished `chat` held the terminal that long, and so
did every engine process, tensor-parallel rank and benchmark the test suite starts. What of the teardown has an
effect outside the process is done here first: the threads Python would wait for are joined, atexit handlers run
(logging's flush, weakref finalizers such as temporary directories' cleanup, multiprocessing's), stdout and stderr are
flushed. Then os._exit, as if the process had been killed once clean."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: object) -> NoReturn:
    """End the process with `code` as SystemExit(code) would (None: 0; an int: itself; anything else printed to
    stderr, then 1), skipping the interpreter's finalization."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is not main and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing more can reach it
            pass
    os._exit(status & 0xFF)
