"""`minisgl bench-compare a.json b.json ...`: one table and one plot across the JSON results of bench-serve (single runs
and sweeps), bench-trace and bench-offline, from this project or from another engine's runs, with what produced each
run (engine, GPU, commit, flags)."""

from __future__ import annotations

import hashlib
import json
import reprlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from minisgl_cli.report import finite_number

# not shown: output switches, and bench-trace's vllm_args (derived from --vllm-arg, which is shown when given)
FLAG_SKIP = {
    "json_path",
    "csv_path",
    "plot",
    "step_log",
    "quiet",
    "save_detailed",
    "client_check",
    "no_client_check",
    "label",
    "vllm_args",
}


def register(app: typer.Typer) -> None:
    @app.command("bench-compare", short_help="Compare saved runs side by side: throughput and latencies per run.")
    def bench_compare(
        files: Annotated[list[Path], typer.Argument(help="JSON results of bench-serve, bench-trace or bench-offline")],
        plot: Annotated[Path | None, typer.Option("--plot", help="draw every run to this PNG (matplotlib)")] = None,
    ) -> None:
        """Compare runs: throughput, TTFT/TPOT/TBT (inter-token)/E2E p50 and p99 per run (per load point of a
        sweep), beside each run's engine, GPU or device, commit and flags."""
        from rich.console import Console

        from minisgl_cli.report import check_outputs

        check_outputs(plot=plot)
        if plot is not None:
            from minisgl_cli.plots import require_matplotlib

            require_matplotlib()
        _refuse_repeats(files)
        runs = [run for f in files for run in load_runs(f)]
        console = Console()
        console.print(_runs_table(runs))
        console.print(_figures_table(runs))
        for note in _notes(runs):
            console.print(note)
        if plot is not None:
            from minisgl_cli.plots import plot_compare

            plot_compare(runs, plot)
            console.print(f"plot written to {plot}")


KINDS = ("bench-serve", "bench-trace", "bench-offline")
OTHER_SERVE = "serving (vLLM/SGLang)"  # `vllm bench serve` / SGLang bench_serving --save-result files


def _kind(d: dict[str, Any]) -> str:
    if isinstance(d.get("benchmark"), str):  # null in a hand-edited file: told by its fields, as an older file's
        return str(d["benchmark"])
    if "sweep" in d:
        return "bench-serve"
    if "trace" in d:
        return "bench-trace"
    if "workload" in d and "num_seqs" in (d.get("workload") or {}):
        return "bench-offline"
    return OTHER_SERVE if "backend" in d or "model_id" in d else "unknown"


# what a bench-serve workload's fields say of its requests; not the load (arrival, duration), the run's procedure
# (warm-up, cache flush) nor what came of it (truncated/repeated prompts). A dataset's prompt column picks other
# prompts; the endpoint (`backend`: openai = /v1/completions, openai-chat = /v1/chat/completions, which wraps each
# prompt in the chat template) sends the same prompts as other tokens.
SERVE_WORKLOAD = (
    "source",
    "input_len",
    "output_len",
    "prompt_format",
    "prefix_groups",
    "prefix_len",
    "seed",
    "dataset_column",
)


def _workload(kind: str, d: dict[str, Any]) -> Any:
    """What identifies a result's requests, to tell runs on different workloads apart (None: not recorded). A
    bench-offline run's digest of its prompts and output lengths; bench-serve's fields describing its requests;
    bench-trace's trace file and the part of it replayed, scaled as it was."""
    found = d.get("workload")
    wl: dict[str, Any] = found if isinstance(found, dict) else {}
    if kind == "bench-offline":
        if wl.get("digest") is not None:
            return ("digest", str(wl["digest"]))
        fields: tuple[str, ...] = ("source", "num_seqs", "input_len", "output_len", "seed", "temperature")
        return ("offline", *(repr(wl.get(k)) for k in fields)) if wl else None
    if kind == "bench-serve":
        return ("serve", repr(d.get("backend")), *(repr(wl.get(k)) for k in SERVE_WORKLOAD)) if wl else None
    if kind == "bench-trace" and isinstance(d.get("trace"), str):
        fields = ("start", "planned_requests", "length_scale", "time_scale", "seed")
        return ("trace", Path(d["trace"]).name, *(repr(d.get(k)) for k in fields))
    return None


# What runs compared like for like share: (what, the key of the run's aspects, the runs it is compared across). A value
# not recorded (a `vllm bench serve` file names no GPU) is compared with none; a workload is one benchmark's, and an
# engine's version compared with that engine's others.
ASPECTS = (
    ("benchmarks", "benchmark", None),
    ("models", "model", None),
    ("workloads", "workload", "kind"),
    ("GPUs / devices", "hardware", None),
    ("dtypes", "dtype", None),
    ("KV cache dtypes", "kv_cache_dtype", None),
    ("TP sizes", "tp", None),
    ("engine versions", "version", "engine"),
)
Seen = tuple[Any, str | None]  # an aspect's value, and how the note names it (None: by the runs' # alone)


def _setup(d: dict[str, Any], engine: str | None) -> dict[str, Seen | None]:
    """A result's (or a bench-offline peer's) GPU or device, dtypes, TP size and engine version, as the notes compare
    them: in-process runs record them, a --url run none of them."""
    device = d.get("device")
    found = d.get("environment")
    env: dict[str, Any] = found if isinstance(found, dict) else {}
    version = d.get(f"{engine}_version") or env.get(engine) if engine else None  # vllm_version; environment.minisgl
    shown = {
        "hardware": d.get("gpu") or (device if isinstance(device, str) and not device.startswith("cuda") else None),
        "dtype": d.get("dtype"),
        "kv_cache_dtype": d.get("kv_cache_dtype"),
        "tp": d.get("tp"),
    }
    setup: dict[str, Seen | None] = {k: None if v is None else (str(v), str(v)) for k, v in shown.items()}
    setup["tp"] = (str(shown["tp"]), f"TP {shown['tp']}") if shown["tp"] is not None else None
    setup["version"] = (version, f"{engine} {version}") if isinstance(version, str) else None
    return setup


def _numbers(ids: list[int]) -> str:
    """Runs by #, three or more in a row as a range ("#1-#35, #59"): a note on 300 runs listed each."""
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][-1] + 1:
            spans[-1].append(i)
        else:
            spans.append([i])
    return ", ".join(f"#{s[0]}-#{s[-1]}" if len(s) > 2 else ", ".join(f"#{i}" for i in s) for s in spans)


def _notes(runs: list[dict[str, Any]]) -> list[str]:
    """A note for each aspect on which runs differ, naming the runs (by #) of each value where they do, and one for each
    result given more than once."""
    from rich.markup import escape

    notes = []
    for what, key, scope in ASPECTS:
        groups: dict[Any, dict[Seen, list[int]]] = {}
        for i, r in enumerate(runs, 1):
            if (seen := r["aspects"][key]) is not None:
                groups.setdefault(r[scope] if scope else None, {}).setdefault(seen, []).append(i)
        differ = [(seen, ids) for g in groups.values() if len({v for v, _ in g}) > 1 for seen, ids in g.items()]
        differ.sort(key=lambda group: group[1][0])
        if differ:
            parts = "; ".join(" ".join(filter(None, (_numbers(ids), label))) for (_, label), ids in differ)
            notes.append(f"these runs are of different {what} ({parts}): their figures are not like for like")
    # one result in two files (a run copied): its figures showed twice, as two runs that agreed
    copies: dict[str, dict[str, list[int]]] = {}
    for i, r in enumerate(runs, 1):  # a bench-offline result's peers with it
        copies.setdefault(r["content"], {}).setdefault(r["file"], []).append(i)
    for sources in (s for s in copies.values() if len(s) > 1):
        parts = "; ".join(f"{_numbers(ids)} {escape(source)}" for source, ids in sources.items())
        notes.append(f"these runs are one result, field for field ({parts}): a run copied, not runs that agree")
    return [f"[yellow]note:[/yellow] {note}" for note in notes]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _figures(d: dict[str, Any]) -> dict[str, Any]:
    """One result's figures under the names bench-serve uses (bench-trace's e2e_latency read as e2el)."""
    row = {k: v for k, v in d.items() if not isinstance(v, (list, dict))}
    for stat in ("mean", "median", "p90", "p99", "max"):
        if f"{stat}_e2e_latency_ms" in d and f"{stat}_e2el_ms" not in d:
            row[f"{stat}_e2el_ms"] = d[f"{stat}_e2e_latency_ms"]
    row.setdefault("load", d.get("load") or _save_result_load(d) or "-")
    return row


def _save_result_load(d: dict[str, Any]) -> str | None:
    """The load a vLLM/SGLang `--save-result` file was run at (it has no `load`): its request rate ("inf" or a
    number), or its ramp (vLLM's ramp_up_* fields; its request_rate is then "inf", which it requires), and
    concurrency cap, so that two such runs at different loads are told apart."""
    from minisgl_cli.arrivals import ramp_label

    parts = []
    rate, cap = d.get("request_rate"), d.get("max_concurrency")
    strategy = d.get("ramp_up_strategy")
    if isinstance(strategy, str) and _is_number(d.get("ramp_up_start_rps")) and _is_number(d.get("ramp_up_end_rps")):
        parts.append(ramp_label(strategy, d["ramp_up_start_rps"], d["ramp_up_end_rps"]))
    elif _is_number(rate) or isinstance(rate, str) and rate:
        parts.append(f"rate {rate:g}" if _is_number(rate) else f"rate {rate}")
    if _is_number(cap):
        parts.append(f"concurrency {cap}")
    return ", ".join(parts) or None


def _defaults(kind: str) -> tuple[dict[str, Any], set[str]]:
    """The command's own defaults, so a run shows only the flags it was given, and the names of its arguments (shown
    as their values, not as flags)."""
    from minisgl_cli.app import app

    group = typer.main.get_command(app)
    cmd = getattr(group, "commands", {}).get(kind)  # typer's group is not a click.Group: it vendors click
    params = cmd.params if cmd else []
    return {p.name: p.default for p in params}, {p.name for p in params if p.param_type_name == "argument"}


# What the tables and the plot read from a result (or a sweep's load point), so each is checked once, here: a text
# field that is not a string is no rich cell, a figure that is not a finite number no point on the plot.
TEXT_FIELDS = (
    *("benchmark", "label", "engine", "backend", "mode", "model_id", "model", "gpu", "url", "device"),
    *("dtype", "kv_cache_dtype", "vllm_version"),
)
FIGURES = (
    "request_throughput",
    *(f"{stat}_{m}_ms" for stat in ("median", "p99") for m in ("ttft", "tpot", "itl", "e2el", "e2e_latency")),
)


@dataclass(frozen=True, slots=True)
class _Line:
    """One run of a JSON Lines file: SGLang's bench_serving (and `vllm bench serve --append-result`) append a line
    per run to one file. Named and refused as "FILE line N"."""

    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path} line {self.line}"

    @property
    def stem(self) -> str:
        return f"{self.path.stem}:{self.line}"


Source = Path | _Line


def _refuse(path: Source, problem: str) -> typer.BadParameter:
    return typer.BadParameter(f"{path}: {problem}", param_hint="FILES")


def _check_text(path: Source, d: dict[str, Any], at: str = "") -> None:
    """Refuse, naming the field, a result (`at`: or its peer) whose text fields are not strings."""
    for key in TEXT_FIELDS:
        if d.get(key) is not None and not isinstance(d[key], str):
            raise _refuse(path, f"'{at}{key}' must be a string (got {reprlib.repr(d[key])})")
    if d.get("tp") is not None and not isinstance(d["tp"], str) and not _is_number(d["tp"]):
        raise _refuse(path, f"'{at}tp' must be a number (got {reprlib.repr(d['tp'])})")


def _check_fields(path: Source, d: dict[str, Any]) -> None:
    """Refuse, naming the field, a result whose fields are not of the types bench-compare reads them as."""
    _check_text(path, d)
    for key in ("environment", "flags", "workload"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise _refuse(path, f"'{key}' must be an object (got {reprlib.repr(d[key])})")
    env = d.get("environment") or {}
    if env.get("commit") is not None and not isinstance(env["commit"], str):
        raise _refuse(path, f"'environment.commit' must be a string (got {reprlib.repr(env['commit'])})")
    for key, value in (("environment.dirty", env.get("dirty")), ("partial", d.get("partial"))):
        if value is not None and not isinstance(value, bool):
            raise _refuse(path, f"'{key}' must be true or false (got {reprlib.repr(value)})")
    sweep = d.get("sweep")
    if sweep is not None and (not isinstance(sweep, list) or not sweep or not all(isinstance(r, dict) for r in sweep)):
        raise _refuse(path, "'sweep' must be a non-empty list of load points")
    for i, row in enumerate(sweep or [d]):
        where, at = (f"sweep[{i}]", f"sweep[{i}].") if sweep else ("the result", "")
        if not _is_number(row.get("output_throughput")):
            got = reprlib.repr(row.get("output_throughput"))
            raise _refuse(path, f"{where} has no numeric output_throughput (got {got})")
        for key in ("output_throughput", *FIGURES):  # NaN and Infinity parse as JSON, and print as nan / inf
            if row.get(key) is not None and not finite_number(row[key]):
                raise _refuse(path, f"'{at}{key}' must be a finite number (got {reprlib.repr(row[key])})")
        if "load" in row and not isinstance(row["load"], str) and not _is_number(row["load"]):  # null too
            raise _refuse(path, f"'{at}load' must be a string or a number (got {reprlib.repr(row['load'])})")


def load_runs(path: Path) -> list[dict[str, Any]]:
    """Each run of a result file (one, or a JSON Lines file's one per line), and with a `bench-offline --compare`
    result each peer's beside it (same workload, same machine)."""
    return [run for src, d in _read(path) for run in _runs(src, d)]


def _runs(src: Source, d: Any) -> list[dict[str, Any]]:
    from minisgl_cli.bench_offline import unread_flags
    from minisgl_cli.peers import PEERS

    run = _run(src, d)
    peers = d.get("peers") if run["kind"] == "bench-offline" else None
    if peers is None and run["kind"] == "bench-offline" and isinstance(d.get("peer"), dict):
        peers = [d["peer"]]  # files written before the list of peers (and the `benchmark` field) name one `peer`
    if not isinstance(peers, list):
        return [run]
    out = [run]
    for i, peer in enumerate(peers):
        if not isinstance(peer, dict) or not _is_number(peer.get("output_throughput")):
            raise _refuse(src, f"peers[{i}] has no numeric output_throughput")
        if not finite_number(peer["output_throughput"]):
            raise _refuse(src, f"'peers[{i}].output_throughput' must be a finite number")
        _check_text(src, peer, f"peers[{i}].")
        engine = peer.get("engine") if isinstance(peer.get("engine"), str) else f"peer {i + 1}"
        # its child got the workload's flags and its own, not minisgl's engine flags nor the parent's --compare
        unread = {"compare", "vllm_env", *(unread_flags(engine) if engine in PEERS else ())}
        setup = _setup(peer, engine)
        setup["hardware"] = setup["hardware"] or run["aspects"]["hardware"]  # on the run's machine
        env = peer.get("environment")
        commit = env.get("commit") if isinstance(env, dict) and isinstance(env.get("commit"), str) else None
        out.append(
            run
            | {
                "name": f"{src.stem} ({engine})",
                "engine": engine,
                "commit": commit or run["commit"],
                "flags": _shown_flags(d.get("flags") or {}, run["kind"], unread),
                "aspects": run["aspects"] | setup,
                "rows": [_figures(peer)],
            }
        )
    return out


def _cannot_read(src: Source, e: Exception) -> typer.BadParameter:
    why = "JSON nested too deeply" if isinstance(e, RecursionError) else str(e)
    return typer.BadParameter(f"cannot read {src}: {why}", param_hint="FILES")


def _refuse_repeats(files: list[Path]) -> None:
    """Refuse a file given twice (or under two names: a symlink, `a/../b.json`): its runs showed twice, as two runs
    that agreed."""
    seen: dict[tuple[int, int], Path] = {}
    for path in files:
        try:
            st = path.stat()
        except OSError:
            continue  # reading it says why
        if (first := seen.setdefault((st.st_dev, st.st_ino), path)) is not path:
            again = "is given twice" if str(first) == str(path) else f"is the same file as {first}"
            raise _refuse(path, f"{again}: its runs would show twice, as two runs that agree; give it once")


def _read(path: Path) -> list[tuple[Source, Any]]:
    """The file's JSON document, or each line's of a JSON Lines file."""
    if path.is_dir():
        raise _refuse(path, f"is a directory: give the result files in it ({path / '*.json'})")
    try:
        text = path.read_text()
    except (OSError, ValueError) as e:  # ValueError: not UTF-8
        raise _cannot_read(path, e) from e
    if not text.strip():
        raise _cannot_read(path, ValueError("the file is empty"))
    try:
        return [(path, json.loads(text))]
    except (ValueError, RecursionError) as e:  # json's C parser gives up on deep nesting with a RecursionError
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if not (isinstance(e, json.JSONDecodeError) and e.msg == "Extra data" and len(lines) > 1):
            raise _cannot_read(path, e) from e
        try:
            return [(_Line(path, n), json.loads(line)) for n, line in lines]
        except (ValueError, RecursionError):  # not JSON Lines either: say what is wrong with it as one document
            raise _cannot_read(path, e) from e


def _run(path: Source, d: Any) -> dict[str, Any]:
    if not isinstance(d, dict) or "output_throughput" not in d and not d.get("sweep"):
        named = d.get("benchmark") if isinstance(d, dict) else None
        if named in KINDS:  # one of ours, its figures taken out
            raise _refuse(path, f"this {named} result has no figures (no output_throughput, nor a sweep of loads)")
        other = f" (a {named} result)" if isinstance(named, str) else ""
        raise typer.BadParameter(
            f"{path} is not a bench-serve, bench-trace or bench-offline result{other} (no output_throughput or sweep)",
            param_hint="FILES",
        )
    _check_fields(path, d)
    kind = _kind(d)
    sweep = d.get("sweep")
    rows = [_figures(r) for r in sweep] if sweep else [_figures(d)]
    env = d.get("environment") or {}
    flags = d.get("flags") or {}
    engine = d.get("engine") or ("minisgl" if d.get("mode") == "in-process" else None)
    if kind == OTHER_SERVE:
        engine = engine or d.get("backend")
    where = d.get("url") or d.get("device") or "?"
    # the --model given, where the run records it: in-process runs name the model by its config ("tiny-llama"), --url
    # runs by the server's name for it ("dummy:tiny-llama"), and the two were called different models
    model = (flags.get("model") if isinstance(flags.get("model"), str) else None) or d.get("model_id") or d.get("model")
    return {
        "name": d.get("label") or f"{path.stem} ({engine or where})",
        "file": str(path),  # or a JSON Lines file's line
        "kind": kind,
        "engine": engine,
        "model": model,
        "gpu": d.get("gpu") or where,
        "commit": (env.get("commit") or "") + (" (dirty)" if env.get("dirty") else "") or None,
        "flags": _shown_flags(flags, kind),
        "partial": bool(d.get("partial")),
        "content": hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest(),  # of the whole result
        "aspects": {
            # bench-serve writes vLLM's benchmark_serving fields so that its result and a `vllm bench serve` one
            # compare: the same kind of run, though told apart in the table
            "benchmark": ("bench-serve" if kind == OTHER_SERVE else kind, kind),
            "model": (model, model) if model else None,
            "workload": (w, None) if (w := _workload(kind, d)) is not None else None,
            **_setup(d, engine),
        },
        "rows": rows,
    }


def _shown_flags(flags: dict[str, Any], kind: str, unread: Collection[str] = ()) -> str:
    """The flags a run was given (those that differ from the command's defaults), without the output switches and
    `unread` (a bench-offline peer's row: minisgl's engine flags, which its child was not given)."""
    defaults, arguments = _defaults(kind)
    return " ".join(
        str(v) if k in arguments else f"--{k.replace('_', '-')} {v}"
        for k, v in flags.items()
        # an older file's False for a switch that is now an option with no value by default (--compare) was no flag
        if k not in FLAG_SKIP
        and k not in unread
        and v is not None  # a hand-edited null: no value given (shown as "--seed None")
        and v != defaults.get(k)
        and not (v is False and defaults.get(k) is None)
    )


def _runs_table(runs: list[dict[str, Any]]):
    from rich.table import Table

    t = Table(title="runs", title_justify="left")
    for col in ("#", "run", "benchmark", "engine", "model", "GPU / device / URL", "commit", "flags"):
        t.add_column(col, overflow="fold")
    for i, r in enumerate(runs, 1):
        kind = r["kind"] + (" (partial)" if r["partial"] else "")
        t.add_row(
            str(i),
            r["name"],
            kind,
            r["engine"] or "?",
            str(r["model"] or "?"),
            str(r["gpu"]),
            r["commit"] or "?",
            r["flags"],
        )
    return t


def _figures_table(runs: list[dict[str, Any]]):
    from minisgl_cli.report import fmt, kv_table

    def pair(row: dict[str, Any], key: str) -> str:
        return f"{fmt(row.get(f'median_{key}_ms'))} / {fmt(row.get(f'p99_{key}_ms'))}"

    def done(row: dict[str, Any]) -> str:
        """completed / failed requests: the figures count the completed ones only, so failures must show."""
        ok, failed, sent = row.get("completed"), row.get("failed"), row.get("num_prompts")
        if not _is_number(failed) and _is_number(ok) and _is_number(sent):  # vLLM/SGLang files: num_prompts
            failed = row["num_prompts"] - row["completed"]
        if not _is_number(ok):
            return "?"
        return (
            f"{fmt(ok)} / [red]{fmt(failed)}[/red]" if _is_number(failed) and failed else f"{fmt(ok)} / {fmt(failed)}"
        )

    from minisgl_cli.run_figures import load_name

    lines = []
    for i, r in enumerate(runs, 1):
        for row in r["rows"]:
            load = load_name(row) + (" ◀ knee" if row.get("knee") else "")
            lines.append(
                (
                    f"#{i} {load}",
                    done(row),
                    row.get("request_throughput"),
                    row.get("output_throughput"),
                    pair(row, "ttft"),
                    pair(row, "tpot"),
                    pair(row, "itl"),
                    pair(row, "e2el"),
                )
            )
    cols = [
        "run / load",
        "done / failed",
        "req/s",
        "out tok/s",
        *(f"{m} p50/p99 ms" for m in ("TTFT", "TPOT", "TBT", "E2E")),
    ]
    return kv_table("figures", lines, cols)
