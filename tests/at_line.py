"""Doing something at an exact line of the code under test (a signal, another process's write), not at a moment:
races a test could otherwise only hope to hit."""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def at_line(func: Callable[..., Any], marker: str, action: Callable[[], None]) -> Iterator[list[int]]:
    """Within the block, `action` runs once, just before the first line of `func` that holds `marker` runs (on this
    thread). Yields a list that holds that line's number once the action ran."""
    lines, first = inspect.getsourcelines(func)
    target = first + next(i for i, line in enumerate(lines) if marker in line)
    done: list[int] = []

    def local(frame, event, _arg):
        if event == "line" and frame.f_lineno == target and not done:
            done.append(target)
            action()
        return local

    def tracer(frame, _event, _arg):
        return local if frame.f_code is func.__code__ else None

    sys.settrace(tracer)
    try:
        yield done
    finally:
        sys.settrace(None)
