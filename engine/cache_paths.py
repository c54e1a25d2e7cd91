"""Where minisgl keeps what it caches on disk, and the XDG base directories it keeps its files under (torch-free:
the CLI's `minisgl cache` and the chat's session store read it without the engine)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$MINISGL_CACHE_DIR, else $XDG_CACHE_HOME/minisgl (an absolute one: xdg_home), else ~/.cache/minisgl."""
    if d := os.environ.get("MINISGL_CACHE_DIR"):
        return Path(d)
    return xdg_home("XDG_CACHE_HOME", ".cache") / "minisgl"


def xdg_home(var: str, default: str) -> Path:
    """An XDG base directory ($XDG_CACHE_HOME, $XDG_DATA_HOME): the variable when it is an absolute path, else
    ~/`default`. A relative value is ignored, as the XDG Base Directory spec says (it would move the files with the
    working directory)."""
    value = os.environ.get(var, "")
    return Path(value) if os.path.isabs(value) else Path.home() / default
