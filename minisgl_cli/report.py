"""Benchmark results: latency statistics, rich tables, JSON files."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

STATS = ("mean", "std", "p50", "p90", "p99", "max")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on already sorted values."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def finite_number(v: Any) -> bool:
    """A figure that is a number (not a bool) and finite; an int too large for a float is none."""
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:
        return False


def latency_stats(values: Iterable[float]) -> dict[str, float | None]:
    """mean/std/p50/p90/p99/max in milliseconds (None when there are no values); std as numpy's (population)."""
    v = sorted(x * 1000 for x in values)
    if not v:
        return {k: None for k in STATS}
    mean = sum(v) / len(v)
    return {
        "mean": mean,
        "std": math.sqrt(sum((x - mean) ** 2 for x in v) / len(v)),
        "p50": percentile(v, 50),
        "p90": percentile(v, 90),
        "p99": percentile(v, 99),
        "max": v[-1],
    }


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def kv_table(title: str, rows: Sequence[tuple[Any, ...]], columns: Sequence[str] = ("", "")):
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=any(columns))
    table.add_column(columns[0], style="bold")
    for c in columns[1:]:
        table.add_column(c, justify="right")
    for label, *values in rows:
        table.add_row(label, *(fmt(v) for v in values))
    return table


def environment() -> dict[str, Any]:
    """Versions, the git commit (and whether the tree had changes), the platform and the command line, so a stored
    result says what produced it and how to run it again."""
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    # The launcher's word first: a copied tree (the GPU machine) may carry a stale .git.
    env["commit"] = os.environ.get("MINISGL_COMMIT", "")
    if not env["commit"]:
        try:
            env["commit"] = (
                subprocess.run(
                    ["git", "rev-parse", "--short", "HEAD"],
                    capture_output=True,
                    text=True,
                    cwd=Path(__file__).parent,
                    timeout=5,
                ).stdout.strip()
                or "unknown"
            )
        except (OSError, subprocess.SubprocessError):
            env["commit"] = "unknown"
    env["dirty"] = _dirty() if not os.environ.get("MINISGL_COMMIT") else None
    try:
        from importlib import metadata

        env["minisgl"] = metadata.version("minisgl")
    except Exception:  # not installed as a package (PYTHONPATH=.)
        pass
    env["platform"] = platform.platform()
    env["cpu_count"] = os.cpu_count()
    env["command"] = command_line()
    return env


def _dirty() -> bool | None:
    """Whether the tree has uncommitted changes to tracked files (the commit alone does not say what ran)."""
    try:
        r = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(r.stdout.strip()) if r.returncode == 0 else None


def command_line() -> str | None:
    """The command as typed (`minisgl ...`, or `python -m minisgl_cli ...`), to run it again; None when the
    command was invoked some other way (a test's CliRunner)."""
    import shlex
    import sys

    if Path(sys.argv[0]).name not in ("minisgl", "__main__.py"):
        return None
    args, secret = [], False
    for a in sys.argv[1:]:  # --api-key's value is a secret: never in a results file that may be shared
        if secret:
            a, secret = "<redacted>", False
        elif a == "--api-key":
            secret = True
        elif a.startswith("--api-key="):
            a = "--api-key=<redacted>"
        args.append(a)
    return shlex.join(["minisgl", *args])


def output_problem(path: Path) -> str | None:
    """Why `path` cannot be written as a file (None when it can): a directory given for a file, a parent that is a
    file, a directory this user cannot write in. A missing parent is fine (it is created when the file is written).
    Checked before a run starts, so that a run never ends in a traceback that loses its results."""
    import tempfile

    if path.is_dir():
        return f"{path} is a directory; give a file name"
    if path.exists():
        if not os.access(path, os.W_OK):
            return f"{path} is not writable"
        return None
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot create {path}: {parent} is a file, not a directory"
    try:  # os.access says yes to root on a read-only file system: try it
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        return f"cannot write in {parent} ({e.strerror or e})"
    return None


# The image formats matplotlib writes (its Agg backend's and the vector ones), by the --plot file's extension
PLOT_FORMATS = ("png", "svg", "svgz", "pdf", "jpg", "jpeg", "webp", "tif", "tiff", "eps", "ps")


def check_outputs(**paths: Path | None) -> None:
    """Fail with a CLI error (exit 2) naming the flag, before anything runs, when one of the output files given
    (flag name -> path, e.g. json=Path(...), step_log=...) cannot be written, or two flags name the same file. A plot
    needs an image format's extension: matplotlib refused .txt only once the run was over, and added .png to a name
    without one, so the file written was not the one reported."""
    import typer

    seen: dict[Path, str] = {}
    for name, path in paths.items():
        if path is None:
            continue
        flag = name if name.isupper() else "--" + name.replace("_", "-")
        if why := output_problem(path):
            raise typer.BadParameter(why, param_hint=flag)
        key = path.resolve()  # `a/../b.json` and a symlink name the file they reach
        if key in seen:
            raise typer.BadParameter(f"{path} is also given to {seen[key]}", param_hint=flag)
        seen[key] = flag
        if name == "plot" and path.suffix.lower().lstrip(".") not in PLOT_FORMATS:
            what = f"its extension {path.suffix!r}" if path.suffix else "no extension"
            formats = ", ".join("." + f for f in PLOT_FORMATS)
            why = f"{path} has {what}: an image file's name ends in one of {formats}"
            raise typer.BadParameter(why, param_hint=flag)


# Ctrl-C's exit status (128 + SIGINT): a benchmark cut short by it exits so once its partial results are out.
INTERRUPTED_EXIT = 130


def interrupted_fields(interrupted: bool) -> dict[str, Any]:
    """How a result cut short by Ctrl-C is marked in a benchmark's JSON (bench-compare lists it as partial)."""
    return {"partial": interrupted, "stopped": "interrupted" if interrupted else None}


def interrupted_note(done: int, planned: int, what: str, note: str = "") -> str:
    """The line printed under the table of results cut short by Ctrl-C: how many of the planned units finished."""
    return f"[yellow]partial results:[/yellow] interrupted after {done:,} of {planned:,} {what} finished{note}"


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """An output file written once the run is over: a failure then (a full disk, a file system gone read-only) ends
    the command with one line naming the file and exit status 1, not a traceback."""
    import typer

    try:
        yield
    except OSError as e:
        typer.echo(f"error: cannot write {path}: {e.strerror or e}", err=True)
        raise typer.Exit(1) from None


def write_json(path: Path, data: dict) -> None:
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def command_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """A command's flags as given, JSON-ready, so a stored result says how it was produced."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in flags.items()}
