"""Where minisgl keeps what it caches on disk (torch-free: the CLI's `minisgl cache` reads it without the engine)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$MINISGL_CACHE_DIR, else $XDG_CACHE_HOME/minisgl, else ~/.cache/minisgl. A relative XDG_CACHE_HOME is
    ignored, as the XDG Base Directory spec says (it would move the cache with the working directory)."""
    if d := os.environ.get("MINISGL_CACHE_DIR"):
        return Path(d)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "minisgl"
