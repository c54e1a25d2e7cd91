"""The dequantized GGUF model kept as a Hugging Face directory (config.json, model.safetensors, tokenizer files)
in the user's cache, so the second start skips the GGUF reader, the dequantization and the slow GGUF tokenizer
conversion (docs/benchmarks.md has the times). Beside them, gguf-blocks/ keeps the file's quantized blocks that
the CPU kernel reads (kernels/cpu_ops.py), the block type of each in the safetensors metadata; a folder of its
own, so that a reader of the directory's *.safetensors (ours, transformers) sees only the model. Keyed by the file's
name, size and a hash of its header and of blocks sampled over it (`fingerprint`); an unwritable cache costs a
warning, never a failure. MINISGL_WEIGHT_CACHE=0 turns it off; MINISGL_CACHE_DIR moves it."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.cache_paths import cache_root
from engine.model_config import ModelConfig

if TYPE_CHECKING:  # imported where used: finding an entry (a front end's tokenizer) needs no torch
    import torch

    from kernels.cpu_ops import QuantMatrix

# Bump when what is stored changes (3: gguf-blocks/; 4: entry.json; 5: keyed by content, not mtime; 6: by all of
# it, not by samples). A GGUF's rope_freqs.weight, stored as config.json's rope_scaling {"rope_type":
# "freq_factors", ...}, needed none: such files were refused until then (no older entry is of one), and every other
# file's entry is written as before. 7: config.json names a GGUF's missing BOS / EOS as null (left out, a Llama's now
# reads as transformers' default, 1 / 2).
FORMAT = 7
QUANT_FILE = "gguf-blocks/blocks.safetensors"
MANIFEST = "entry.json"  # written last: every other file of the entry with its size
HASHES = "hashes"  # beside the entries: a file's content hash by what its inode says of it (see fingerprint)


def enabled() -> bool:
    return os.environ.get("MINISGL_WEIGHT_CACHE", "1") != "0"


def fingerprint(gguf: Path) -> str:
    """The file's size and a hash of all it holds. Not its mtime: two different files of one name, size and mtime
    (`cp -p`, `tar x`, `rsync -a`) shared an entry, and the same file installed again (another machine, another venv:
    what `minisgl cache import` is for) never found its own. Not a sample of it either: a file edited in place past
    the samples (a chat template in a GGUF's header beyond its first MiB) kept its stale entry.

    Hashing all of it reads the file (0.15 s for the embedded 98 MB model here, seconds for a large GGUF), so the hash
    is remembered under the file's device, inode, size, mtime and ctime: a write to the file, even one that puts its
    mtime back, moves its ctime, which no user can set; a copy or a new install is another inode, hashed once."""
    import hashlib

    st = gguf.stat()
    memo = (
        cache_root()
        / f"gguf-v{FORMAT}"
        / HASHES
        / f"{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}-{st.st_ctime_ns}"
    )
    try:
        known = memo.read_text()
        if known.startswith(f"{st.st_size}-") and len(known) == len(str(st.st_size)) + 33:
            return known
    except (OSError, UnicodeDecodeError):
        pass
    h = hashlib.blake2b(digest_size=16)
    with gguf.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    key = f"{st.st_size}-{h.hexdigest()}"
    try:  # written whole or not at all: a reader never takes half a key
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(key)
            tmp.replace(memo)
        finally:  # Ctrl-C between the two (a command's load interrupted) left the staging file behind
            tmp.unlink(missing_ok=True)
    except OSError:  # an unwritable cache: hashed again next time
        pass
    return key


def entry(gguf: Path) -> Path:
    """The cache directory for this file; its last part is the file's stem, which becomes the model's name."""
    return cache_root() / f"gguf-v{FORMAT}" / fingerprint(gguf) / gguf.stem


def _remove_stale(final: Path) -> None:
    """Staging folders of stores that were killed (SIGKILL, SIGTERM: no `finally` ran), hundreds of MB each that
    nothing read or removed: those of processes that no longer exist."""
    for old in final.parent.glob(f".{final.name}.*.tmp"):
        try:
            os.kill(int(old.name.rsplit(".", 2)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (ValueError, OSError):  # not our name, or a live process of another user
            pass


def lookup(gguf: Path) -> Path | None:
    if not enabled():
        return None
    try:
        d = entry(gguf)
    except OSError:
        return None
    if not d.exists():
        return None
    if (why := _damage(d)) is None:
        # a store killed while another process completed this entry left its staging folder (hundreds of MB), which
        # only a later store swept: with the entry in place no store comes
        _remove_stale(d)
        return d
    # A damaged entry (a file cut short or removed since, a disk error) would fail every start, or load without its
    # tokenizer: it is removed and the GGUF read again (which stores a fresh one).
    print(f"minisgl: the cached conversion {d} is damaged ({why}); removing it and reading {gguf}", file=sys.stderr)
    shutil.rmtree(d, ignore_errors=True)
    return None


def _damage(d: Path) -> str | None:
    """Why the entry at d is not whole (None: it is): its manifest, the files and sizes it lists, the safetensors
    headers."""
    from safetensors import safe_open

    try:
        files = json.loads((d / MANIFEST).read_text())["files"]
        for name, size in files.items():
            if (d / name).stat().st_size != size:
                return f"{name} has {(d / name).stat().st_size} bytes, not {size}"
        for name in ("config.json", "model.safetensors", QUANT_FILE):
            if name not in files:
                return f"no {name}"
        json.loads((d / "config.json").read_text())
        for name in ("model.safetensors", QUANT_FILE):
            with safe_open(str(d / name), "np"):  # its header only ("pt" would import torch)
                pass
    except Exception as e:  # OSError, JSON, a safetensors header: all mean the same here
        return f"{type(e).__name__}: {e}"
    return None


def store(
    gguf: Path,
    cfg: ModelConfig,
    weights: dict[str, torch.Tensor],
    tokenizer: Any | None,
    quantized: dict[str, QuantMatrix],
) -> Path | None:
    """Write the entry (to a temporary directory renamed into place, so a reader never sees half of one)."""
    if not enabled():
        return None
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tmp: Path | None = None
    try:
        final = entry(gguf)
        if final.parent.is_dir():
            _remove_stale(final)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=1))
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
        blocks = {k: v for name, q in quantized.items() for k, v in q.tensors(name).items()}
        (tmp / QUANT_FILE).parent.mkdir()
        # `or None`: safetensors writes an unreadable header for an empty metadata dict (a GGUF without such blocks)
        save_file(blocks, str(tmp / QUANT_FILE), metadata={name: q.kind for name, q in quantized.items()} or None)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        sizes = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": sizes}, indent=1))
        try:
            tmp.rename(final)
        except OSError:  # another process (a tensor-parallel rank) got there first
            if lookup(gguf) is None:
                raise
        return final
    except (OSError, SafetensorError) as e:  # safetensors reports a full disk (ENOSPC, EDQUOT) as its own error
        print(
            f"minisgl: cannot cache the dequantized weights under {cache_root()} ({e}); next start dequantizes again"
            " (set MINISGL_CACHE_DIR to a writable directory, or MINISGL_WEIGHT_CACHE=0)",
            file=sys.stderr,
        )
        return None
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_quantized(entry_dir: Path) -> dict[str, QuantMatrix]:
    """The quantized blocks stored with a cache entry, by weight name."""
    from safetensors import safe_open

    from kernels.cpu_ops import QuantMatrix

    with safe_open(str(entry_dir / QUANT_FILE), "pt") as f:
        kinds = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  # safe_open is no mapping
    return {name: QuantMatrix.from_tensors(kind, name, tensors) for name, kind in kinds.items()}
