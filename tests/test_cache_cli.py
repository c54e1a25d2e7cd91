"""`minisgl cache export / import / info`: a real round trip through the caches' directories (pointed at temporary
ones by the variables their owners read), and archives that must be refused before anything is written."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minisgl_cli.app import app
from tests.test_bench_offline import flat


@pytest.fixture
def caches(tmp_path, monkeypatch) -> dict[str, Path]:
    dirs = {
        "minisgl": tmp_path / "m",
        "flashinfer": tmp_path / "fi" / ".cache" / "flashinfer",
        "triton": tmp_path / "tr",
        "fa4": tmp_path / "fa4",
    }
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(dirs["minisgl"]))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "fi"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(dirs["triton"]))
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(dirs["fa4"]))
    return dirs


def fill(dirs: dict[str, Path]) -> dict[str, bytes]:
    files = {
        "minisgl/gguf-v1/1-2/model/model.safetensors": b"w" * 1000,
        "flashinfer/0.7.2/90a/cached_ops/batch_prefill/batch_prefill.so": b"\x7fELF" + bytes(range(256)),
        "triton/ABCD/rms_norm.cubin": b"cubin",
        "triton/ABCD/rms_norm.json": b"{}",
        "fa4/k.o": b"o",
    }
    for i, (rel, data) in enumerate(files.items()):
        name, rest = rel.split("/", 1)
        p = dirs[name] / rest
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        # Build tools compare these to the nanosecond (ninja's deps log): they must survive exactly, sub-second part
        # included (a float of seconds since 1970 keeps only ~0.2 us).
        ns = (1_700_000_000 + i) * 10**9 + 123_456_789
        os.utime(p, ns=(ns, ns))
    return files


def mtimes(dirs: dict[str, Path]) -> dict[str, int]:
    return {
        f"{name}/{p.relative_to(d).as_posix()}": p.stat().st_mtime_ns
        for name, d in dirs.items()
        if d.exists()
        for p in d.rglob("*")
        if p.is_file()
    }


def read_back(dirs: dict[str, Path]) -> dict[str, bytes]:
    return {
        f"{name}/{p.relative_to(d).as_posix()}": p.read_bytes()
        for name, d in dirs.items()
        if d.exists()
        for p in d.rglob("*")
        if p.is_file()
    }


def test_export_then_import_restores_every_cache(caches, tmp_path):
    files = fill(caches)
    times = mtimes(caches)
    archive = tmp_path / "caches.tar.gz"
    r = CliRunner().invoke(app, ["cache", "export", str(archive)])
    assert r.exit_code == 0, r.output
    assert "flashinfer 1 files" in flat(r.output) and "triton 2 files" in flat(r.output)
    info = CliRunner().invoke(app, ["cache", "info"], env={"COLUMNS": "250"})
    assert info.exit_code == 0 and str(caches["triton"]) in info.output
    for d in caches.values():  # a new machine: nothing cached
        for p in sorted(d.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
    assert read_back(caches) == {}
    r = CliRunner().invoke(app, ["cache", "import", str(archive)])
    assert r.exit_code == 0, r.output
    assert "imported 5 files" in flat(r.output) and "versions differ" not in r.output
    assert read_back(caches) == files
    assert mtimes(caches) == times


def _archive(
    path: Path,
    members: dict[str, bytes] | list[tuple[str, bytes]],
    manifest: bool | bytes = True,
    pax: dict[str, dict[str, str]] | None = None,
) -> Path:
    """A gzipped (PAX) tar of these members, in order (a list may name one twice), plus a manifest; `pax` gives a
    member its PAX header fields."""
    mf = b"{}" if manifest is True else manifest
    items = list(members.items() if isinstance(members, dict) else members)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in items + ([("minisgl-cache.json", mf)] if mf else []):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.pax_headers = (pax or {}).get(name, {})
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    "members, manifest, why",
    [
        ({"triton/x": b"1", "../evil": b"2"}, True, "refusing member '../evil'"),
        ({"triton/x": b"1", "/etc/evil": b"2"}, True, "refusing member '/etc/evil'"),
        ({"triton/x": b"1", "vllm/x": b"2"}, True, "belongs to no cache this machine has"),
        ({"triton/x": b"1"}, False, "no minisgl-cache.json"),
        # the manifest's versions are read only after the import, where the files were already written (then a
        # traceback, exit 1): now checked first
        ({"triton/x": b"1"}, b'{"versions": [1]}', "has 'versions' [1], not an object of package versions"),
        ({"triton/x": b"1"}, b'{"versions": "abc"}', "has 'versions' 'abc', not an object of package versions"),
        ({"triton/x": b"1"}, b'{"versions": null}', "has 'versions' None, not an object of package versions"),
        ({"triton/x": b"1"}, b'{"versions": {"torch": 2}}', "has 'versions' {'torch': 2}, not an object of package"),
    ],
)
def test_bad_archives_are_refused_before_anything_is_written(caches, tmp_path, members, manifest, why):
    archive = _archive(tmp_path / "bad.tar.gz", members, manifest)
    r = CliRunner().invoke(app, ["cache", "import", str(archive)])
    assert r.exit_code == 2 and why in flat(r.output), r.output
    assert read_back(caches) == {} and not (tmp_path.parent / "evil").exists()


@pytest.mark.parametrize(
    "pax, why",
    [
        ({"MINISGL.mtime_ns": "abc"}, "has a MINISGL.mtime_ns of 'abc', not an integer"),  # was a ValueError
        ({"MINISGL.mtime_ns": "1_000"}, "has a MINISGL.mtime_ns of '1_000', not an integer"),  # int() takes it
        ({"MINISGL.mtime_ns": "9" * 40}, "has a modification time out of range (MINISGL.mtime_ns '99999"),  # Overflow
        ({"MINISGL.mtime_ns": str(2**63 * 10**9)}, "has a modification time out of range"),  # one past time_t
        ({"MINISGL.mtime_ns": "9" * 5000}, "has a modification time out of range"),  # past int()'s 4,300 digits
        ({"mtime": "1e999"}, "has a modification time out of range (mtime inf)"),  # tar's own field, as a float
        ({"mtime": "nan"}, "has a modification time out of range (mtime nan)"),
    ],
)
def test_a_bad_modification_time_is_refused_before_anything_is_written(caches, tmp_path, pax, why):
    """The file's time is set after it is written: a time os.utime cannot take ended the import in a traceback."""
    archive = _archive(tmp_path / "t.tar.gz", {"triton/a": b"1", "triton/b": b"2"}, pax={"triton/b": pax})
    r = CliRunner().invoke(app, ["cache", "import", str(archive)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert f"member 'triton/b' {why}" in flat(r.output)
    assert read_back(caches) == {}
    ok = _archive(tmp_path / "ok.tar.gz", {"triton/b": b"2"}, pax={"triton/b": {"MINISGL.mtime_ns": "-1500000000"}})
    assert CliRunner().invoke(app, ["cache", "import", str(ok)]).exit_code == 0  # before 1970 is a time
    assert (caches["triton"] / "b").stat().st_mtime_ns == -1_500_000_000


@pytest.mark.parametrize(
    "members, why",
    [
        ([("minisgl/x", b"1"), ("minisgl/x", b"2")], "refusing member 'minisgl/x': the archive holds that file twice"),
        (
            [("minisgl/./x", b"1"), ("minisgl/x", b"2")],
            "refusing member 'minisgl/x': the archive holds that file twice",
        ),
        ([("minisgl/x", b"1"), ("minisgl-cache.json", b"{}")], "it holds minisgl-cache.json twice"),
    ],
)
def test_a_member_twice_is_refused_before_anything_is_written(caches, tmp_path, members, why):
    """The second copy's staging replaced the first's: 'only 1 of 2 files were imported' (exit 2), with the file in
    the cache all the same."""
    archive = _archive(tmp_path / "d.tar.gz", [("triton/a", b"0"), *members])
    r = CliRunner().invoke(app, ["cache", "import", str(archive)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert why in flat(r.output)
    assert read_back(caches) == {}


def test_not_an_archive(caches, tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_text("hello")
    r = CliRunner().invoke(app, ["cache", "import", str(junk)])
    assert r.exit_code == 2 and "not a cache archive" in flat(r.output)
    r = CliRunner().invoke(app, ["cache", "import", str(tmp_path / "missing.tar.gz")])
    assert r.exit_code == 2 and "does not exist" in flat(r.output)
    r = CliRunner().invoke(app, ["cache", "import", str(tmp_path)])  # was "does not exist"
    assert r.exit_code == 2 and "is a directory: give the archive" in flat(r.output), r.output
    from minisgl_cli.cache import CacheArchiveError, import_

    with pytest.raises(CacheArchiveError, match="not a cache archive") as e:  # tarfile lists its tries line by line
        import_(junk)
    assert "\n" not in str(e.value) and "method gz" in str(e.value)


def test_export_creates_a_missing_parent_and_leaves_no_partial_file(caches, tmp_path):
    fill(caches)
    archive = tmp_path / "new" / "dir" / "c.tar.gz"
    r = CliRunner().invoke(app, ["cache", "export", str(archive)])
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert tarfile.is_tarfile(archive)
    assert [p.name for p in archive.parent.iterdir()] == ["c.tar.gz"]


def test_truncated_or_corrupt_archives_are_refused_before_anything_is_written(caches, tmp_path):
    """A cut-short download: a gzip stream that ends early (was a bare 'Aborted.', exit 1), a plain tar that ends
    mid-member (a ReadError traceback), a manifest that is not a JSON object (a traceback, after the files were
    already written)."""
    fill(caches)
    good = tmp_path / "good.tar.gz"
    assert CliRunner().invoke(app, ["cache", "export", str(good)]).exit_code == 0
    for d in caches.values():
        for p in sorted(d.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
    raw = good.read_bytes()
    plain = gzip.decompress(raw)
    bad = {
        "cut.tar.gz": raw[: len(raw) // 2],
        "head.tar.gz": raw[:60],
        "cut.tar": plain[: len(plain) // 2],
    }
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
        r = CliRunner().invoke(app, ["cache", "import", str(tmp_path / name)])
        assert r.exit_code == 2, (name, r.output, r.exception)
        assert "truncated or corrupt archive" in flat(r.output) or "not a cache archive" in flat(r.output), name
        assert read_back(caches) == {}, name
    for manifest in (b"not json", b"[1, 2]"):
        archive = _archive(tmp_path / "m.tar.gz", {"triton/x": b"1"}, manifest)
        r = CliRunner().invoke(app, ["cache", "import", str(archive)])
        assert r.exit_code == 2 and "is not a JSON object" in flat(r.output), r.output
        assert read_back(caches) == {}


def test_a_failed_write_imports_nothing(caches, tmp_path):
    """The second file cannot be written (a directory stands where it goes): the first one, already written, was
    left in place and the import ended in a traceback; now the import is refused whole, naming the path."""
    (caches["triton"] / "b").mkdir(parents=True)
    archive = _archive(tmp_path / "a.tar.gz", {"triton/a": b"1", "triton/b": b"2", "minisgl/new/dir/c": b"3"})
    r = CliRunner().invoke(app, ["cache", "import", str(archive)])
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert "a directory is in the way" in flat(r.output) and "nothing was imported" in flat(r.output)
    assert read_back(caches) == {} and not caches["minisgl"].exists()  # no file, no directory made for one
    assert sorted(p.name for p in caches["triton"].iterdir()) == ["b"]
    archive = _archive(tmp_path / "c.tar.gz", {"triton/a": b"1", "triton/a/b": b"2"})  # a file and a folder
    r = CliRunner().invoke(app, ["cache", "import", str(archive)])
    assert r.exit_code == 2 and "refusing member 'triton/a/b'" in flat(r.output), r.output
    assert read_back(caches) == {}


def test_empty_caches_export_and_import_say_so(caches, tmp_path):
    info = CliRunner().invoke(app, ["cache", "info"], env={"COLUMNS": "250"})
    assert info.exit_code == 0 and str(caches["minisgl"]) in info.output
    archive = tmp_path / "empty.tar.gz"
    r = CliRunner().invoke(app, ["cache", "export", str(archive)])
    assert r.exit_code == 0 and "minisgl 0 files" in flat(r.output), r.output
    for _ in range(2):  # twice: the same outcome
        r = CliRunner().invoke(app, ["cache", "import", str(archive)])
        assert r.exit_code == 0 and "imported 0 files: nothing" in flat(r.output), r.output
    assert read_back(caches) == {}


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    """The XDG Base Directory spec: a relative $XDG_CACHE_HOME is invalid and must be ignored (it was used, so the
    cache moved with the working directory)."""
    from engine.cache_paths import cache_root

    monkeypatch.delenv("MINISGL_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", "rel/cache")
    assert cache_root() == tmp_path / "home" / ".cache" / "minisgl"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache_root() == tmp_path / "home" / ".cache" / "minisgl"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "minisgl"


def test_import_never_writes_through_a_symlink_inside_a_cache(caches, tmp_path):
    """A folder inside a cache that is a symlink to somewhere else took the import's files there (outside the caches
    altogether); now the archive is refused before anything is written. A file-level symlink, and one left at the
    temporary name a file is staged under, are replaced, never written through."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (caches["triton"]).mkdir(parents=True)
    (caches["triton"] / "link").symlink_to(outside, target_is_directory=True)
    archive = _archive(tmp_path / "a.tar.gz", {"triton/ok": b"1", "triton/link/sub/x": b"2"})
    r = CliRunner().invoke(app, ["cache", "import", str(archive)])
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert "refusing member 'triton/link/sub/x'" in flat(r.output) and "is a symbolic link" in flat(r.output)
    assert list(outside.iterdir()) == [] and not (caches["triton"] / "ok").exists()
    (caches["triton"] / "link").unlink()
    victim = outside / "victim"
    victim.write_bytes(b"mine")
    (caches["triton"] / "f").symlink_to(victim)
    (caches["triton"] / "g.minisgl-import").symlink_to(victim)
    archive = _archive(tmp_path / "b.tar.gz", {"triton/f": b"1", "triton/g": b"2"})
    r = CliRunner().invoke(app, ["cache", "import", str(archive)])
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert victim.read_bytes() == b"mine" and list(outside.iterdir()) == [victim]
    assert read_back(caches) == {"triton/f": b"1", "triton/g": b"2"}
    assert not (caches["triton"] / "f").is_symlink() and not (caches["triton"] / "g.minisgl-import").exists()


def test_export_of_files_removed_or_unreadable_meanwhile(caches, tmp_path, monkeypatch):
    """A cache in use: a file listed for the export is gone when it is read (was a FileNotFoundError traceback), so
    it is skipped with a note; a file that cannot be read (was a PermissionError traceback) fails the export,
    naming it, with no archive (or partial one) left behind."""
    from minisgl_cli import cache

    fill(caches)
    gone = caches["triton"] / "ABCD" / "rms_norm.json"
    listed = cache._files

    def files_then_remove(root: Path) -> list[Path]:
        out = listed(root)
        if gone in out:
            gone.unlink()
        return out

    monkeypatch.setattr(cache, "_files", files_then_remove)
    archive = tmp_path / "c.tar.gz"
    r = CliRunner().invoke(app, ["cache", "export", str(archive)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert f"skipped {gone}: it was removed while the export ran" in flat(r.output)
    assert "triton 1 files" in flat(r.output)
    with tarfile.open(archive) as tar:
        assert "triton/ABCD/rms_norm.cubin" in tar.getnames() and "triton/ABCD/rms_norm.json" not in tar.getnames()
    archive.unlink()

    secret = caches["minisgl"] / "gguf-v1" / "1-2" / "model" / "model.safetensors"
    real_open = Path.open

    def denied(self: Path, *args, **kwargs):
        if self == secret:  # what chmod 000 does to a user who is not root
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    r = CliRunner().invoke(app, ["cache", "export", str(archive)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert f"cannot read {secret} (Permission denied); no archive was written" in flat(r.output)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == []


def test_export_to_a_fifo_or_through_a_symlink(caches, tmp_path):
    """The archive's .partial file was renamed over whatever ARCHIVE was: a FIFO (its reader then waited forever), a
    device (as root, /dev/full became a regular file) or a symlink (its target never written)."""
    fill(caches)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    r = CliRunner().invoke(app, ["cache", "export", str(fifo)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert f"{fifo} is not a regular file" in flat(r.output) and stat.S_ISFIFO(fifo.stat().st_mode)
    target, link = tmp_path / "real.tar.gz", tmp_path / "link.tar.gz"
    link.symlink_to(target)
    r = CliRunner().invoke(app, ["cache", "export", str(link)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert link.is_symlink() and tarfile.is_tarfile(target)


def test_export_into_a_cache_folder_is_refused(caches, tmp_path):
    """An archive written inside a cache packed its own partial file (`triton/c.tar.gz.partial`), and would be
    imported as a cache file; now refused before anything is made, a missing folder for it included."""
    fill(caches)
    archive = caches["triton"] / "new" / "c.tar.gz"
    r = CliRunner().invoke(app, ["cache", "export", str(archive)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert f"{archive} is inside the triton cache ({caches['triton']}): write it elsewhere" in flat(r.output)
    assert not (caches["triton"] / "new").exists()


def test_an_fa4_cache_where_this_machine_keeps_none_names_the_variable(caches, tmp_path, monkeypatch):
    """FlashAttention-4 keeps a cache only where FLASH_ATTENTION_CUTE_DSL_CACHE_DIR says: an archive exported with it
    was refused on a machine without it as 'belongs to no cache this machine has (minisgl, flashinfer, triton)',
    which did not say how to import it. Nothing is written; with the variable set it imports."""
    archive = _archive(tmp_path / "a.tgz", {"triton/x": b"1", "fa4/k.o": b"2"})
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")
    r = CliRunner().invoke(app, ["cache", "import", str(archive)])
    assert r.exit_code == 2 and "set FLASH_ATTENTION_CUTE_DSL_CACHE_DIR to a folder for it" in flat(r.output), r.output
    assert read_back(caches) == {}
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(caches["fa4"]))
    r = CliRunner().invoke(app, ["cache", "import", str(archive)])
    assert r.exit_code == 0 and read_back(caches) == {"triton/x": b"1", "fa4/k.o": b"2"}, r.output
