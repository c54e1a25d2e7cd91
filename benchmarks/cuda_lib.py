"""Builds a benchmark's CUDA source with the toolkit's nvcc into a shared library, once per machine, source and GPU
architecture (in the minisgl cache), and loads it with ctypes. Kernels launched through it run on the stream passed
to them, so torch's current stream (and CUDA-graph capture) works as for any torch op."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import torch


def _cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "minisgl" / "cuda"


def _nvcc() -> str:
    for cand in (
        shutil.which("nvcc"),
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
    ):
        if cand and os.path.exists(cand):
            return cand
    raise RuntimeError(
        "building a benchmark's CUDA kernel needs the CUDA toolkit's nvcc (on PATH or in $CUDA_HOME/bin)"
    )


def _local_includes(source: Path) -> list[Path]:
    """The files `source` includes from its own folder (`#include "name"`), so that a change to one rebuilds it."""
    names = re.findall(r'^#include "([^"]+)"', source.read_text(), flags=re.M)
    return [source.with_name(n) for n in names]


def build(source: Path, device: torch.device | None = None) -> ctypes.CDLL:
    """`source` built for `device`'s architecture (sm_90a on Hopper, for its wgmma/bulk-copy instructions)."""
    major, minor = torch.cuda.get_device_capability(device)
    arch = f"{major}{minor}{'a' if major == 9 else ''}"
    digest = hashlib.sha1(b"".join(f.read_bytes() for f in [source, *_local_includes(source)])).hexdigest()[:12]
    target = _cache_dir() / f"{source.stem}-{digest}-sm{arch}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        cmd = [_nvcc(), "-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-shared",
               "-Xcompiler", "-fPIC", "-o", str(tmp), str(source)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"building {source.name} failed:\n{done.stderr[-2000:]}")
        tmp.replace(target)
    return ctypes.CDLL(str(target))
