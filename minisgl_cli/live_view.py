"""The live view of a running benchmark: requests done / in flight / failed, running TTFT and TPOT p50/p99, tok/s
(and a ramp's rate by then). Rendered by rich's refresh thread twice a second from plain counters, so the client's
event loop pays nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.live import Live

import time

from minisgl_cli.replay import LiveCounters
from minisgl_cli.report import fmt, latency_stats


class LiveView:
    def __init__(
        self,
        title: str,
        total: int | None,
        counters: LiveCounters,
        quiet: bool = False,
        rate_at: Callable[[float], float] | None = None,
    ):
        """`rate_at`: a ramp's rate t seconds into the run (shown as it grows)."""
        self.title, self.total, self.c, self.quiet, self.rate_at = title, total, counters, quiet, rate_at
        self.t0 = time.perf_counter()
        self._last = (self.t0, 0)
        self._rate = 0.0
        self._live: Live | None = None

    def __enter__(self) -> LiveView:
        if not self.quiet:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(
                get_renderable=self.render, console=Console(stderr=True), refresh_per_second=2, transient=True
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def render(self):
        from rich.table import Table

        now, c = time.perf_counter(), self.c
        t_last, tok_last = self._last
        if now - t_last >= 0.4:  # tok/s over the last refresh
            self._rate, self._last = (c.tokens - tok_last) / (now - t_last), (now, c.tokens)
        done = list(c.done)
        failed = sum(not r.ok for r in done)
        ttft = latency_stats(r.ttft for r in done if r.ttft is not None)
        tpot = latency_stats(r.tpot for r in done if r.tpot is not None)
        table = Table(title=self.title, title_justify="left", show_header=True, box=None, pad_edge=False)
        cols = ["done", "in flight", "failed", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "tok/s", "elapsed"]
        total = f"/{self.total:,}" if self.total else ""
        cells = [
            f"{len(done):,}{total}",
            f"{c.in_flight:,}",
            f"{failed:,}",
            f"{fmt(ttft['p50'], 1)} / {fmt(ttft['p99'], 1)}",
            f"{fmt(tpot['p50'], 2)} / {fmt(tpot['p99'], 2)}",
            f"{self._rate:,.0f}",
            f"{now - self.t0:.1f} s",
        ]
        if self.rate_at is not None:  # from the run's own start (the drive's clock), not the view's
            cols.insert(0, "ramp req/s")
            cells.insert(0, f"{self.rate_at(now - c.started):.3g}" if c.started else "-")
        for col in cols:
            table.add_column(col, justify="right")
        table.add_row(*cells)
        return table
