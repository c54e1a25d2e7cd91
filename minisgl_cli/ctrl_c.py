"""Ctrl-C that lands in a finalizer. Python runs `__del__` methods and weakref callbacks wherever the collector
or a reference count frees an object, in the middle of any code. A KeyboardInterrupt raised inside one cannot reach
the code it interrupted: Python prints "Exception ignored in ..." with a traceback and carries on, so the Ctrl-C is
lost and the command keeps running (a `bench-offline --compare` peer stopped while it imported transformers printed
that traceback and ran on, found by a CI run of test_bench_offline). Imports nothing heavy: it is installed before the
CLI's own imports."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator


def deliver_after_finalizers() -> None:
    """From now on, a KeyboardInterrupt that a finalizer swallows is signalled again to this process, so that it is
    raised where Python next checks for signals once the finalizer is done (should that be inside another finalizer,
    it is sent again), instead of being printed and dropped."""
    if getattr(sys.unraisablehook, "_minisgl_ctrl_c", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # From another thread, not waited for: signalled from this one, or while this one waits for a thread to
            # start, the interrupt would be raised at once, in this hook, and be lost the same way.
            _thread.start_new_thread(os.kill, (os.getpid(), signal.SIGINT))
            return
        previous(unraisable)

    hook._minisgl_ctrl_c = True  # type: ignore[attr-defined]  # installed once, however many entry points call this
    sys.unraisablehook = hook


@contextlib.contextmanager
def noting_ctrl_c() -> Iterator[list[int]]:
    """Ctrl-C raises KeyboardInterrupt as always and is also noted in the list yielded: code that caught the
    interrupt and raised an error of its own in its place (a library's `except BaseException`, an extension module
    whose import it cut short, reported as an ImportError and wrapped again) is still known to have been stopped by
    it. Outside the main thread, or where Ctrl-C has another handler (ignored, a command's own), nothing changes."""
    noted: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield noted
        return

    def note(signum: int, frame: object) -> None:
        noted.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
