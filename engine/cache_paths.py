"""Where minisgl keeps what it caches on disk (torch-free: the CLI's `minisgl cache` reads it without the engine)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$MINISGL_CACHE_DIR, else $XDG_CACHE_HOME/minisgl, else ~/.cache/minisgl."""
    if d := os.environ.get("MINISGL_CACHE_DIR"):
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minisgl"
