"""PNG plots of benchmark results (matplotlib, the optional `plot` extra): a sweep against load, one run's
per-request TTFT and TBT over time, a ramped load against the rate each request was sent at, bench-offline's steps
over time, and several runs side by side."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from minisgl_cli.report import finite_number, writing

MAX_POINTS = 40_000  # TBT scatter points drawn (evenly thinned beyond this)


def require_matplotlib() -> None:
    """Fail before a run, not after it, when --plot cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise typer.BadParameter(
            "needs matplotlib, which is not installed: pip install 'minisgl[plot]' (or matplotlib)",
            param_hint="--plot",
        ) from None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> None:
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout(rect=rect)
        fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def plot_timeline(results: Sequence[Any], path: Path, title: str) -> None:
    """One run: each request's TTFT at its scheduled send time, and every inter-token gap at its arrival time."""
    from minisgl_cli.run_figures import token_times

    plt = _pyplot()
    ok = [r for r in results if r.ttft is not None]
    t0 = min((r.scheduled for r in results), default=0.0)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    a1.scatter([r.scheduled - t0 for r in ok], [r.ttft * 1000 for r in ok], s=8, alpha=0.7)
    failed = [r.scheduled - t0 for r in results if not r.ok]
    if failed:
        a1.scatter(failed, [0] * len(failed), marker="x", color="red", s=20, label=f"failed ({len(failed)})")
        a1.legend(loc="upper left")
    a1.set_ylabel("TTFT (ms)")
    a1.set_title(title)
    xs = [t - t0 for r in ok for t in token_times(r)[1:]]  # each gap where it ended
    ys = [gap * 1000 for r in ok for gap in r.itls]
    step = max(1, len(xs) // MAX_POINTS)
    a2.scatter(xs[::step], ys[::step], s=2, alpha=0.4, color="tab:orange")
    a2.set_ylabel("TBT (ms, per token or chunk)")
    a2.set_xlabel("time since the run's start (s)")
    positive = [y for y in ys if y > 0]
    if positive and max(positive) / min(positive) > 20:  # gaps of 0 (tokens read together) stay on the axis
        a2.set_yscale("symlog", linthresh=0.1)  # within one decade symlog has no tick to label: stay linear there
    for a in (a1, a2):
        a.grid(alpha=0.3)
    _save(fig, path)


RAMP_BANDS = 10  # a ramp's plot: p50/p99 over 10 groups of as many requests along its rate, throughput in 10 windows
RAMP_WINDOW_MIN = 5  # sends in a throughput window at the least (fewer windows for a short ramp)


def plot_ramp(results: Sequence[Any], rates: Sequence[float], path: Path, title: str, log_rate: bool) -> None:
    """One ramped load against the rate each request was sent at (`rates`, one per result; a log axis for an
    exponential ramp): the requests and output tokens per second that ended in each window of its sending time
    against the ramp's mean rate in it (on the diagonal: finishing as fast as it sends), then each request's TTFT and
    TPOT with the p50 and p99 of groups of as many requests along the ramp."""
    from minisgl_cli.run_figures import rate_bands, token_times

    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(8, 9.5), sharex=True)
    sent = sorted(zip((r.scheduled for r in results), rates))
    a = axes[0]
    # windows of the sending time, each as many sends (a window of a fixed width holds few at the ramp's start)
    k = min(RAMP_BANDS, len(sent) // RAMP_WINDOW_MIN)
    edges = [sent[j * len(sent) // k][0] for j in range(k)] + [sent[-1][0]] if k else []
    windows = []
    arrived = sorted(t for r in results if r.ok for t in token_times(r))  # once, each window counts its part
    for j in range(k):
        lo, hi = edges[j], edges[j + 1]
        if hi <= lo:
            continue
        offered = [rate for t, rate in sent[j * len(sent) // k : (j + 1) * len(sent) // k]]
        ended = sum(r.ok and r.e2e is not None and lo <= r.scheduled + r.e2e < hi for r in results)
        tokens = bisect.bisect_left(arrived, hi) - bisect.bisect_left(arrived, lo)
        windows.append((sum(offered) / len(offered), ended / (hi - lo), tokens / (hi - lo)))
    if windows:
        x = [w[0] for w in windows]
        a.plot(x, x, ":", color="tab:gray", label="the ramp's rate")
        a.plot(x, [w[1] for w in windows], "o-", ms=3, label="requests finished/s")
        b2 = a.twinx()
        b2.plot(x, [w[2] for w in windows], "s--", ms=3, color="tab:orange", label="output tok/s")
        b2.set_ylabel("output tok/s")
        b2.legend(loc="lower right")
        a.legend(loc="upper left")
    a.set_ylabel("requests/s")
    a.set_title(title)
    bands = rate_bands(list(results), list(rates), RAMP_BANDS)
    # each group's middle rate, on the axis' own scale
    mids = [math.sqrt(b["from_rps"] * b["to_rps"]) if log_rate else (b["from_rps"] + b["to_rps"]) / 2 for b in bands]
    for ax, key, unit in ((axes[1], "ttft", "TTFT (ms)"), (axes[2], "tpot", "TPOT (ms)")):
        points = [(rate, getattr(r, key) * 1000) for r, rate in zip(results, rates) if getattr(r, key) is not None]
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=6, alpha=0.35, color="tab:blue")
        for stat, style in (("median", "o-"), ("p99", "s--")):
            ax.plot(mids, [b[f"{stat}_{key}_ms"] for b in bands], style, label="p50" if stat == "median" else stat)
        ax.set_ylabel(unit)
        _log_if_wide(ax, [p[1] for p in points])
        ax.legend(loc="upper left")
    failed = [rate for r, rate in zip(results, rates) if not r.ok]
    if failed:  # at the axis' foot whatever its scale: at TTFT 0 they vanished from a log axis, their legend kept
        foot = axes[1].get_xaxis_transform()  # x in requests/s, y in the axes' height
        axes[1].scatter(
            failed, [0.03] * len(failed), marker="x", color="red", s=20, label=f"failed ({len(failed)})", transform=foot
        )
        axes[1].legend(loc="upper left")
    if log_rate and results:  # no request ended (Ctrl-C early): no point, and a log axis of none cannot be drawn
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        axes[-1].set_xscale("log")  # plain numbers at 1, 2, 5 per decade: 2x10^0 labels ran into each other
        axes[-1].xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axes[-1].xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axes[-1].xaxis.set_minor_formatter(NullFormatter())
    axes[-1].set_xlabel("the ramp's rate when the request was sent (requests/s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    _save(fig, path)


def _point_names(
    xs: Sequence[float], ys: Sequence[float | None], rows: Sequence[dict[str, Any]]
) -> list[tuple[float, float, str]]:
    """Which load each point is, once per place: loads past saturation achieve about the same rate, and their names
    written on top of each other could not be read, so points within 2% of the widest rate on both axes share one
    name ("rate 32 / rate inf"). A load cut short says so ("rate inf (max errors)")."""
    from minisgl_cli.run_figures import load_name

    named: list[tuple[float, float, str]] = []
    xspan = max(xs, default=0.0) or 1.0
    yspan = max((y for y in ys if y is not None and finite_number(y)), default=0.0) or 1.0
    for x, y, row in zip(xs, ys, rows):
        if y is None or not finite_number(y):
            continue
        if named and abs(x - named[-1][0]) < 0.02 * xspan and abs(y - named[-1][1]) < 0.02 * yspan:
            named[-1] = (*named[-1][:2], f"{named[-1][2]} / {load_name(row)}")
        else:
            named.append((x, y, load_name(row)))
    return named


def _log_if_wide(ax, values: list[float | None]) -> None:
    v = [x for x in values if x]
    if v and min(v) > 0 and max(v) / min(v) > 20:
        ax.set_yscale("log")


def _load_axis(rows: Sequence[dict[str, Any]]) -> tuple[list[float], list[str]]:
    labels = [r["load"] for r in rows]
    return list(range(len(rows))), labels


def plot_sweep(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """A sweep: output throughput (and goodput), TTFT p50/p99 and TPOT p50/p99 against load; the knee marked."""
    from minisgl_cli.run_figures import by_load

    plt = _pyplot()
    rows = by_load(list(rows))
    x, labels = _load_axis(rows)
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    a = axes[0]
    a.plot(x, [r["output_throughput"] for r in rows], "o-", label="output tok/s")
    a.set_ylabel("output tok/s")
    if any(r.get("request_goodput") is not None for r in rows):
        b = a.twinx()
        b.plot(x, [r.get("request_goodput") for r in rows], "s--", color="tab:green", label="goodput (req/s)")
        b.plot(x, [r["request_throughput"] for r in rows], "^:", color="tab:gray", label="requests/s")
        b.set_ylabel("requests/s")
        b.legend(loc="lower right")
    a.legend(loc="upper left")
    a.set_title(title)
    for ax, key, unit in ((axes[1], "ttft", "TTFT (ms)"), (axes[2], "tpot", "TPOT (ms)")):
        for stat, style in (("median", "o-"), ("p99", "s--")):
            ax.plot(x, [r.get(f"{stat}_{key}_ms") for r in rows], style, label=f"{'p50' if stat == 'median' else stat}")
        ax.set_ylabel(unit)
        _log_if_wide(ax, [r.get(f"{s}_{key}_ms") for r in rows for s in ("median", "p99")])
        ax.legend(loc="upper left")
    for i, r in enumerate(rows):
        if r.get("stop_reason") == "max_errors":  # cut short: its points are no measurement of that load
            axes[0].annotate(
                "max errors",
                (i, r["output_throughput"]),
                color="tab:orange",
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
            )
        if r.get("knee"):
            for ax in axes:
                ax.axvline(i, color="red", alpha=0.4, linestyle=":")
            axes[0].annotate(
                f"knee ({r['knee_reason']})",
                (i, r["output_throughput"]),
                color="red",
                textcoords="offset points",
                xytext=(5, -15),
            )
    axes[-1].set_xticks(x, labels, rotation=20)
    axes[-1].set_xlabel("load")
    for ax in axes:
        ax.grid(alpha=0.3)
    _save(fig, path)


def plot_steps(steps: Sequence[tuple[float, int, int]], path: Path, title: str) -> None:
    """bench-offline: the batch size of every engine step and the output tokens/s (in 1/40ths of the run) against
    time. steps: (seconds since the start, requests in the step, tokens it produced)."""
    plt = _pyplot()
    window = max(steps[-1][0] / 40, 1e-3) if steps else 1.0
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a1.plot([s[0] for s in steps], [s[1] for s in steps], drawstyle="steps-post", lw=0.8)
    a1.set_ylabel("batch size (requests)")
    a1.set_title(title)
    end = steps[-1][0] if steps else 0.0
    nbins = max(1, math.ceil(end / window))
    bins = [0] * nbins
    for t, _, tokens in steps:
        bins[min(int(t / window), nbins - 1)] += tokens
    a2.plot([(i + 0.5) * window for i in range(nbins)], [b / window for b in bins], lw=1)
    a2.set_ylabel(f"output tok/s ({window:g} s bins)")
    a2.set_xlabel("time since the timed run's start (s)")
    for a in (a1, a2):
        a.grid(alpha=0.3)
    _save(fig, path)


def _bars(ax, xs: Sequence[float], values: Sequence[float | None], width: float, label: str | None = None) -> None:
    """Bars of the known values; an unknown one (a figure the run's file does not have) is written "n/a" where its
    bar would stand, not drawn as a zero."""
    known = [(x, v) for x, v in zip(xs, values) if v is not None]
    ax.bar([x for x, _ in known], [v for _, v in known], width, label=label if known else None)
    for x, v in zip(xs, values):
        if v is None:
            ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=8, color="gray")


NAME_CHARS = 48  # a run's name in the plot at the most: file names of 80 characters hid the points under the legends
LEGEND_RUNS = 6  # more runs drawn as lines than this: one legend under the panels (in each panel it hid the points)


def _plot_name(i: int, name: str) -> str:
    """A run as the plot names it: by its # in the tables, and its name cut in the middle (where long names that
    differ, differ at their ends: a run's number, its GPU)."""
    if len(name) > NAME_CHARS:
        name = name[: NAME_CHARS // 2 - 1] + "…" + name[-(NAME_CHARS // 2) :]
    return f"#{i} {name}"


def plot_compare(runs: Sequence[dict[str, Any]], path: Path) -> None:
    """Several runs: sweeps as lines against their load points, single runs as bars (output tok/s, TTFT, TPOT and
    TBT p50/p99)."""
    from minisgl_cli.run_figures import by_load, stop_why

    plt = _pyplot()
    runs = [
        {**r, "name": _plot_name(i, r["name"]), "rows": by_load(r["rows"]) if r["rows"] else r["rows"]}
        for i, r in enumerate(runs, 1)  # a --rate sweep's in load order
    ]
    sweeps = [r for r in runs if r["rows"] and len(r["rows"]) > 1]
    lines = len(runs) if sweeps else 0  # runs drawn as lines: all of them, beside a sweep

    def color(k: int):
        """The k-th line's colour: matplotlib's 10 for up to 10 lines, then tab20's (the 11th took the 1st's)."""
        return f"C{k}" if lines <= 10 else plt.get_cmap("tab20")(k % 20)

    def single_name(run: dict[str, Any]) -> str:
        """A single run's name, with why its one load stopped early (as the figures table names it): its bar or line
        then measures no load."""
        why = stop_why(run["rows"][0]) if run["rows"] else None
        return f"{run['name']} ({why})" if why else run["name"]

    fig, axes = plt.subplots(4, 1, figsize=(9, 12))
    panels = (
        ("output_throughput", "output tok/s", False),
        ("ttft", "TTFT p50 / p99 (ms)", True),
        ("tpot", "TPOT p50 / p99 (ms)", True),
        ("itl", "TBT p50 / p99 (ms)", True),  # the gap between tokens (chunks), where one stall shows
    )
    if sweeps:
        # Each load at the request rate it achieved: sweeps of other loads (rates against concurrencies, another
        # list, guidellm's derived rates) then share one axis. At their place in order they did not: the axis was
        # labelled with the longest sweep's loads, which named other loads than the other sweeps' points.
        for k, run in enumerate(sweeps):
            rows = [row for row in run["rows"] if finite_number(row.get("request_throughput"))]
            xs = [row["request_throughput"] for row in rows]
            label = run["name"]
            if len(rows) < len(run["rows"]):  # a file without the figure (bench-compare reads it as optional)
                label += f" ({len(run['rows']) - len(rows)} of {len(run['rows'])} loads without requests/s, not drawn)"
            for ax, (key, unit, pct) in zip(axes, panels):
                if pct:
                    ax.plot(xs, [row.get(f"median_{key}_ms") for row in rows], "o-", color=color(k), label=label)
                    ax.plot(xs, [row.get(f"p99_{key}_ms") for row in rows], "s--", color=color(k))
                    _log_if_wide(
                        ax, [row.get(f"{s}_{key}_ms") for r in sweeps for row in r["rows"] for s in ("median", "p99")]
                    )
                else:
                    ax.plot(xs, [row.get(key) for row in rows], "o-", color=color(k), label=label)
                ax.set_ylabel(unit)
            for x, y, name in _point_names(xs, [row.get("output_throughput") for row in rows], rows):
                # every other sweep's names below its points: two sweeps' first loads often meet at low rates
                axes[0].annotate(
                    name, (x, y), xytext=(3, 3 if k % 2 == 0 else -10), textcoords="offset points", fontsize=7
                )
        axes[-1].set_xlabel("requests/s achieved (one point per load; the loads named in the top panel)")
    singles = [r for r in runs if r not in sweeps]
    if singles:
        if sweeps:  # both kinds: single runs as horizontal lines across the sweep axes
            for k, run in enumerate(singles):
                row = run["rows"][0]
                for ax, (key, _, pct) in zip(axes, panels):
                    v = row.get(f"median_{key}_ms" if pct else key)
                    if v is not None:
                        name = single_name(run)
                        what = f"{name} (p50)" if pct else name  # throughput is no percentile
                        ax.axhline(v, linestyle=":", color=color(len(sweeps) + k), label=what)
        else:
            names = [single_name(r) for r in singles]
            xs = list(range(len(singles)))
            for ax, (key, unit, pct) in zip(axes, panels):
                if pct:
                    _bars(
                        ax, [x - 0.2 for x in xs], [r["rows"][0].get(f"median_{key}_ms") for r in singles], 0.4, "p50"
                    )
                    _bars(ax, [x + 0.2 for x in xs], [r["rows"][0].get(f"p99_{key}_ms") for r in singles], 0.4, "p99")
                else:
                    _bars(ax, xs, [r["rows"][0].get(key) for r in singles], 0.6)
                ax.set_ylabel(unit)
                # named under the bottom panel alone, each run's name under its bar; #i above (the names overlapped)
                wide = len(singles) > 4
                shown = names if ax is axes[-1] else [name.split(" ")[0] for name in names]
                ax.set_xticks(xs, shown, rotation=(60 if wide else 15) if ax is axes[-1] else 0, fontsize=8)
                if wide and ax is axes[-1]:
                    plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
                ax.set_xlim(-0.6, len(singles) - 0.4)  # a panel of no bar (no run has the figure) kept its "n/a" off it
    axes[0].set_title("bench-compare")
    entries = axes[0].get_legend_handles_labels()
    below = bool(sweeps) and len(entries[0]) > LEGEND_RUNS
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0] and not below:
            ax.legend(fontsize=8)
    if not below:
        _save(fig, path)
        return
    height = 12 + 0.2 * len(entries[0])
    fig.set_size_inches(9, height)
    fig.legend(*entries, loc="lower center", fontsize=8, title="sweeps: p50 solid, p99 dashed; single runs: p50 dotted")
    _save(fig, path, rect=(0, (0.2 * len(entries[0]) + 0.5) / height, 1, 1))
