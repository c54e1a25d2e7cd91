"""Builds a CUDA source with the toolkit's nvcc into a shared library, once per source (and the files it includes),
flags and GPU architecture, in a cache folder the caller names, and loads it with ctypes. Kernels launched through it
run on the stream passed to them, so torch's current stream (and CUDA-graph capture) works as for any torch op. The
engine's CUDA decode (kernels/attention/cuda_decode.py) and the benchmarks' kernels are built here."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import torch

BUILD_TIMEOUT_S = 600


def nvcc() -> str | None:
    """The toolkit's nvcc: on PATH, else in $CUDA_HOME/bin (default /usr/local/cuda); None without one."""
    for cand in (
        shutil.which("nvcc"),
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
    ):
        if cand and os.path.exists(cand):
            return cand
    return None


def _local_includes(source: Path) -> list[Path]:
    """The files `source` includes by a relative path (`#include "name"`), so that a change to one rebuilds it."""
    names = re.findall(r'^#include "([^"]+)"', source.read_text(), flags=re.M)
    return [(source.parent / n).resolve() for n in names]


def arch(device: torch.device | None = None) -> str:
    """The architecture nvcc builds for: sm_90a on Hopper (its wgmma / bulk-copy instructions), else sm_XY."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}{minor}{'a' if major == 9 else ''}"


def library_path(
    source: Path, cache_dir: Path, device: torch.device | None = None, flags: tuple[str, ...] = ()
) -> Path:
    """Where build() keeps `source`'s library: its name carries a digest of the source, its includes and `flags`."""
    digest = hashlib.sha1(b"".join(f.read_bytes() for f in [source, *_local_includes(source)]))
    digest.update(" ".join(flags).encode())
    return cache_dir / f"{source.stem}-{digest.hexdigest()[:12]}-sm{arch(device)}.so"


def build(
    source: Path, cache_dir: Path, device: torch.device | None = None, flags: tuple[str, ...] = ()
) -> ctypes.CDLL:
    """`source` built for `device`'s architecture (unless cache_dir has it) and loaded. Raises RuntimeError with
    nvcc's message when it cannot be built (no nvcc, a compile error, a cache folder that cannot be written)."""
    target = library_path(source, cache_dir, device, flags)
    if not target.exists():
        compiler = nvcc()
        if compiler is None:
            raise RuntimeError(f"building {source.name} needs the CUDA toolkit's nvcc (on PATH or in $CUDA_HOME/bin)")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RuntimeError(f"cannot create the kernel cache {target.parent}: {e}") from e
        # built under a name of this process's own, then renamed: processes building at once (TP ranks) never load
        # a half-written file
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        a = arch(device)
        cmd = [compiler, "-O3", "-std=c++17", f"-gencode=arch=compute_{a},code=sm_{a}", "-shared",
               "-Xcompiler", "-fPIC", *flags, "-o", str(tmp), str(source)]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            if done.returncode == 0:
                tmp.replace(target)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"building {source.name} took over {BUILD_TIMEOUT_S} s") from e
        except OSError as e:  # nvcc not executable, the cache full or read-only
            raise RuntimeError(f"building {source.name} into {target.parent}: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)
        if done.returncode:
            raise RuntimeError(f"building {source.name} failed:\n{done.stderr.strip()[-2000:]}")
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise RuntimeError(f"cannot load {target}: {e}") from e
