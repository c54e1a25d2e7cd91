"""The dequantized GGUF model kept as a Hugging Face directory (config.json, model.safetensors, tokenizer files)
in the user's cache, so the second start skips the GGUF reader, the dequantization and the slow GGUF tokenizer
conversion (docs/benchmarks.md has the times). Keyed by the file's name, size and mtime; an unwritable cache
costs a warning, never a failure. MINISGL_WEIGHT_CACHE=0 turns it off; MINISGL_CACHE_DIR moves it."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from engine.cache_paths import cache_root
from engine.model_config import ModelConfig

FORMAT = 1  # bump when what is stored changes


def enabled() -> bool:
    return os.environ.get("MINISGL_WEIGHT_CACHE", "1") != "0"


def entry(gguf: Path) -> Path:
    """The cache directory for this file; its last part is the file's stem, which becomes the model's name."""
    st = gguf.stat()
    return cache_root() / f"gguf-v{FORMAT}" / f"{st.st_size}-{st.st_mtime_ns}" / gguf.stem


def lookup(gguf: Path) -> Path | None:
    if not enabled():
        return None
    try:
        d = entry(gguf)
    except OSError:
        return None
    return d if (d / "config.json").is_file() and (d / "model.safetensors").is_file() else None


def store(gguf: Path, cfg: ModelConfig, weights: dict[str, torch.Tensor], tokenizer: Any | None) -> Path | None:
    """Write the entry (to a temporary directory renamed into place, so a reader never sees half of one)."""
    if not enabled():
        return None
    from safetensors.torch import save_file

    tmp: Path | None = None
    try:
        final = entry(gguf)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=1))
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        try:
            tmp.rename(final)
        except OSError:  # another process (a tensor-parallel rank) got there first
            if lookup(gguf) is None:
                raise
        return final
    except OSError as e:
        print(
            f"minisgl: cannot cache the dequantized weights under {cache_root()} ({e}); next start dequantizes again"
            " (set MINISGL_CACHE_DIR to a writable directory, or MINISGL_WEIGHT_CACHE=0)",
            file=sys.stderr,
        )
        return None
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
