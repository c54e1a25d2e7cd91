"""`minisgl cache`: what a start-up compiles or converts once (FlashInfer's JIT kernels, Triton's fused kernels,
FlashAttention-4's kernels, the dequantized embedded model) lives in per-user cache directories. `export` packs
them into one archive and `import` unpacks it where this machine looks for them, so a new machine of the same kind
(same GPU, same package versions) starts without compiling (docs/gpu.md has the times)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import re
import reprlib
import tarfile
import time
import zlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from engine.cache_paths import cache_root  # torch-free, like this module: `minisgl --help` stays fast

MANIFEST = "minisgl-cache.json"
# A file's modification time to the nanosecond, in the member's PAX header: tarfile keeps it only as a float, which
# can round a freshly built object a few hundred ns later than ninja's deps log says it was written, and ninja then
# rebuilds the whole module (an imported start took 26 s against 6.9 s on an H200; docs/gpu.md).
MTIME_NS = "MINISGL.mtime_ns"
PACKAGES = ("torch", "flashinfer-python", "triton", "flash-attn-4", "nvidia-cutlass-dsl")


@dataclass(frozen=True, slots=True)
class CacheDir:
    name: str  # the archive's top-level folder for it
    path: Path  # where this machine keeps it (after the environment variables its owner reads)
    what: str


def locations() -> list[CacheDir]:
    home = Path.home()
    triton = os.environ.get("TRITON_CACHE_DIR") or Path(os.environ.get("TRITON_HOME") or home) / ".triton" / "cache"
    fi_base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or home)
    out = [
        CacheDir(
            "minisgl",
            cache_root(),
            "dequantized GGUF weights (a GGUF's second start), compiled CPU kernels, the CUDA decode",
        ),
        CacheDir("flashinfer", fi_base / ".cache" / "flashinfer", "FlashInfer's JIT-compiled attention kernels"),
        CacheDir("triton", Path(triton), "Triton's compiled kernels (fused norm, rope + KV store, SiLU, MoE)"),
    ]
    if fa := os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):  # FA4 caches only when told where
        out.append(CacheDir("fa4", Path(fa), "FlashAttention-4's compiled kernels"))
    return out


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()) if root.is_dir() else []


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


class CacheArchiveError(ValueError):
    pass


def export(dest: Path) -> tuple[dict[str, int], list[str]]:
    """Pack every cache directory that exists into `dest` (tar.gz); returns files per cache and notes on the files
    that were skipped (gone between listing and reading: a cache in use replaces its files). A file that cannot be
    read, or an archive that would land in a cache it packs, is a CacheArchiveError naming it, and nothing is left
    at `dest`."""
    where = dest.absolute().resolve()
    for loc in locations():
        root = loc.path.absolute().resolve()
        if where == root or root in where.parents:  # it would pack itself (its .partial) and be imported as a cache
            raise CacheArchiveError(f"{dest} is inside the {loc.name} cache ({loc.path}): write it elsewhere")
    if dest.is_symlink():  # the archive goes where the link points (replacing the link made a file beside it)
        dest = Path(os.path.realpath(dest))
    if dest.exists() and not dest.is_file():
        # The .partial file renamed over it would replace the FIFO or device itself (as root, /dev/full became a
        # 97 MiB regular file; a FIFO's reader waited forever)
        raise CacheArchiveError(f"{dest} is not a regular file (a FIFO, a device, a socket): give a file path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    notes: list[str] = []
    tmp = dest.with_name(dest.name + ".partial")  # a failed or interrupted export leaves no half archive at dest
    try:
        _export_to(tmp, counts, notes)
        tmp.replace(dest)
    except OSError as e:  # the folder not writable (the file itself was), a full disk: was a traceback
        raise CacheArchiveError(f"cannot write {e.filename or tmp} ({e.strerror or e}); no archive was written") from e
    finally:
        tmp.unlink(missing_ok=True)
    return counts, notes


def _export_to(dest: Path, counts: dict[str, int], notes: list[str]) -> None:
    with tarfile.open(dest, "w:gz") as tar:
        for loc in locations():
            counts[loc.name] = 0
            for f in _files(loc.path):
                try:
                    with f.open("rb") as data:
                        st = os.fstat(data.fileno())  # the file opened, not whatever has its name by now
                        info = tar.gettarinfo(arcname=f"{loc.name}/{f.relative_to(loc.path).as_posix()}", fileobj=data)
                        info.pax_headers = {MTIME_NS: str(st.st_mtime_ns)}
                        tar.addfile(info, data)
                except FileNotFoundError:
                    notes.append(f"skipped {f}: it was removed while the export ran")
                    continue
                except OSError as e:  # unreadable, or cut shorter while being read ('unexpected end of data')
                    raise CacheArchiveError(f"cannot read {f} ({e.strerror or e}); no archive was written") from e
                counts[loc.name] += 1
        manifest = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": counts, "versions": _versions()}
        raw = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(raw), int(time.time())
        tar.addfile(info, io.BytesIO(raw))


def import_(src: Path) -> tuple[dict[str, int], dict]:
    """Read and check the whole archive first (readable to its end, a JSON manifest, every member a regular file at
    a relative path under a known cache), then write every file beside its target and move them all into place: a
    bad archive or a failed write leaves the caches as they were. Returns files per cache and the manifest."""
    where = {loc.name: loc.path for loc in locations()}
    try:
        tar = tarfile.open(src, "r:*")
    except (tarfile.TarError, OSError, EOFError) as e:
        # tarfile lists each compression it tried on a line of its own: one line here
        raise CacheArchiveError(f"{src}: not a cache archive ({' '.join(str(e).split())})") from e
    with tar:
        try:
            members = tar.getmembers()  # reads the archive to its end: a truncated one fails here
            manifest = _manifest(src, tar, members)
            plan = _check_members(src, members, where)
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:  # gzip's BadGzipFile is an OSError
            raise CacheArchiveError(f"{src}: truncated or corrupt archive ({e or type(e).__name__})") from e
        _write_all(src, tar, plan)
    counts: dict[str, int] = {}
    for m, _, _ in plan:
        name = PurePosixPath(m.name).parts[0]
        counts[name] = counts.get(name, 0) + 1
    return counts, manifest


def _manifest(src: Path, tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> dict:
    m = next((m for m in members if m.name == MANIFEST), None)
    if m is None:
        raise CacheArchiveError(f"{src}: not a cache archive made by `minisgl cache export` (no {MANIFEST})")
    if sum(x.name == MANIFEST for x in members) > 1:  # which one would count? (tar's extract takes the last)
        raise CacheArchiveError(f"{src}: it holds {MANIFEST} twice (not made by `minisgl cache export`)")
    data = tar.extractfile(m) if m.isfile() else None
    try:
        manifest = json.loads(data.read()) if data is not None else None
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise CacheArchiveError(f"{src}: its {MANIFEST} is not a JSON object (not made by `minisgl cache export`)")
    # The one field the import reads (to note versions that differ): checked here, before any file is written.
    versions = manifest.get("versions", {})
    if not isinstance(versions, dict) or not all(v is None or isinstance(v, str) for v in versions.values()):
        raise CacheArchiveError(
            f"{src}: its {MANIFEST} has 'versions' {reprlib.repr(versions)}, not an object of package versions"
            " (not made by `minisgl cache export`)"
        )
    return manifest


# os.utime takes a time's seconds as a 64-bit time_t: beyond it, an OverflowError.
TIME_T_RANGE = range(-(2**63), 2**63)


def _mtime_ns(src: Path, m: tarfile.TarInfo) -> int:
    """The member's modification time in ns: the exported one (its PAX header), else the tar header's seconds
    (a float: a PAX `mtime` of 1e999 or nan reads as such)."""
    raw = m.pax_headers.get(MTIME_NS)
    if raw is None:
        ns = int(m.mtime * 1e9) if math.isfinite(m.mtime) else None
    elif re.fullmatch(r"-?[0-9]+", raw):  # not int()'s own syntax, which allows spaces and `_`
        ns = int(raw) if len(raw) <= 30 else None  # longer is past any time_t (and int() refuses 4,300 digits)
    else:
        raise CacheArchiveError(f"{src}: member {m.name!r} has a {MTIME_NS} of {reprlib.repr(raw)}, not an integer")
    if ns is None or ns // 10**9 not in TIME_T_RANGE:
        shown = f"{MTIME_NS} {reprlib.repr(raw)}" if raw is not None else f"mtime {m.mtime}"
        raise CacheArchiveError(f"{src}: member {m.name!r} has a modification time out of range ({shown})")
    return ns


def _check_members(
    src: Path, members: list[tarfile.TarInfo], where: dict[str, Path]
) -> list[tuple[tarfile.TarInfo, Path, int]]:
    plan = []
    seen: set[Path] = set()
    for m in members:
        if m.name == MANIFEST or m.isdir():
            continue
        parts = PurePosixPath(m.name).parts
        if not m.isfile() or PurePosixPath(m.name).is_absolute() or ".." in parts or len(parts) < 2:
            raise CacheArchiveError(f"{src}: refusing member {m.name!r} (only files under a cache folder)")
        if parts[0] == "fa4" and "fa4" not in where:  # FA4 keeps a cache only where this variable says
            raise CacheArchiveError(
                f"{src}: it holds FlashAttention-4's cache ({m.name!r}), which this machine keeps nowhere: set "
                "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR to a folder for it (as on the machine that exported it) and "
                "import again; nothing was imported"
            )
        if parts[0] not in where:
            known = ", ".join(where)
            raise CacheArchiveError(f"{src}: member {m.name!r} belongs to no cache this machine has ({known})")
        root = where[parts[0]]
        target = root.joinpath(*parts[1:])
        # A folder inside the cache that is a symlink (one a user made) would take the write wherever it points,
        # outside the cache too. The cache root itself may be one: where the caches live is the user's setting.
        if link := next((d for d in target.parents if d != root and root in d.parents and d.is_symlink()), None):
            raise CacheArchiveError(
                f"{src}: refusing member {m.name!r}: {link} is a symbolic link, and the import writes only inside the"
                " cache (remove the link, or point the cache's variable at its target)"
            )
        # Written twice, the second copy's staging would replace the first's, and the import end half done. (A tar
        # may append a newer copy of a file; an export never does.) `a/./b` is `a/b`: the target is compared.
        if target in seen:
            raise CacheArchiveError(f"{src}: refusing member {m.name!r}: the archive holds that file twice")
        seen.add(target)
        plan.append((m, target, _mtime_ns(src, m)))
    for m, target, _ in plan:
        if any(d in seen for d in target.parents):
            raise CacheArchiveError(f"{src}: refusing member {m.name!r} (a folder of it is a file in the archive)")
    return plan


def _write_all(src: Path, tar: tarfile.TarFile, plan: list[tuple[tarfile.TarInfo, Path, int]]) -> None:
    """Every file to a temporary name beside its target, then all of them into place; on a failure the temporary
    files and the directories made for them are removed, so the caches are left as they were."""
    staged: list[tuple[Path, Path]] = []
    made: list[Path] = []
    moved = 0
    try:
        for m, target, ns in plan:
            missing = [d for d in (target.parent, *target.parent.parents) if not d.exists()]
            target.parent.mkdir(parents=True, exist_ok=True)
            made += reversed(missing)
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, "a directory is in the way", str(target))
            data = tar.extractfile(m)
            assert data is not None
            tmp = target.with_name(target.name + ".minisgl-import")
            tmp.unlink(missing_ok=True)  # a leftover (or a symlink placed there) is never written through
            staged.append((tmp, target))
            with open(tmp, "xb") as out:
                out.write(data.read())
            os.chmod(tmp, m.mode & 0o777 or 0o644)
            # The exported times, not now, to the nanosecond: FlashInfer's ninja rebuilds a module whose outputs look
            # older than its sources or newer than its deps log (the imported start took 29 s, then 26 s, against
            # 6.9 s; docs/gpu.md).
            os.utime(tmp, ns=(ns, ns))
        for tmp, target in staged:
            tmp.replace(target)  # a reader never sees half a kernel
            moved += 1
    except BaseException as e:
        for tmp, _ in staged[moved:]:
            tmp.unlink(missing_ok=True)
        for d in reversed(made) if not moved else ():
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(e, OSError):
            done = "nothing was imported" if not moved else f"only {moved} of {len(plan)} files were imported"
            raise CacheArchiveError(
                f"{src}: cannot write {e.filename or 'the cache'} ({e.strerror or e}); {done}"
            ) from e
        raise


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def register(app: typer.Typer) -> None:
    cache = typer.Typer(help="Start-up caches (compiled kernels, converted weights): info, export, import.")
    app.add_typer(cache, name="cache")

    @cache.command("info")
    def info() -> None:
        """Where each cache lives on this machine, and how much it holds."""
        t = Table("cache", "path", "files", "size", "what")
        t.columns[1].overflow = "fold"
        for loc in locations():
            files = _files(loc.path)
            t.add_row(loc.name, str(loc.path), str(len(files)), _size(sum(f.stat().st_size for f in files)), loc.what)
        Console().print(t)

    @cache.command("export")
    def export_cmd(
        archive: Annotated[Path, typer.Argument(help="the .tar.gz to write")],
    ) -> None:
        """Pack every cache into one archive, for `minisgl cache import` on a machine of the same kind."""
        from minisgl_cli.report import check_outputs

        check_outputs(ARCHIVE=archive)
        try:
            counts, notes = export(archive)
        except CacheArchiveError as e:
            raise typer.BadParameter(str(e), param_hint="ARCHIVE") from e
        for note in notes:
            Console(stderr=True).print(f"[yellow]note:[/yellow] {note}")
        Console().print(
            f"wrote {archive} ({_size(archive.stat().st_size)}): "
            + ", ".join(f"{name} {n} files" for name, n in counts.items())
        )

    @cache.command("import")
    def import_cmd(
        archive: Annotated[Path, typer.Argument(help="an archive from `minisgl cache export`")],
    ) -> None:
        """Unpack an exported archive into this machine's cache directories (same GPU and versions, or the caches
        simply miss: each owner keys its entries by GPU architecture and version)."""
        if archive.is_dir():
            raise typer.BadParameter(
                f"{archive} is a directory: give the archive `minisgl cache export` wrote", param_hint="ARCHIVE"
            )
        if not archive.exists():
            raise typer.BadParameter(f"{archive} does not exist", param_hint="ARCHIVE")
        try:
            counts, manifest = import_(archive)
        except CacheArchiveError as e:
            raise typer.BadParameter(str(e), param_hint="ARCHIVE") from e
        console = Console()
        console.print(
            f"imported {sum(counts.values())} files: " + (", ".join(f"{k} {v}" for k, v in counts.items()) or "nothing")
        )
        theirs, ours = manifest.get("versions", {}), _versions()
        differ = [f"{p} {theirs.get(p)} there, {ours.get(p)} here" for p in PACKAGES if theirs.get(p) != ours.get(p)]
        if differ:
            console.print(
                "[yellow]note:[/yellow] versions differ, so some entries may never be used: " + "; ".join(differ)
            )
