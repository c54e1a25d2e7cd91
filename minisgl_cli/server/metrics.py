"""/metrics in the Prometheus text format (0.0.4), with vLLM-like names under the `minisgl:` prefix.
Latency histograms are observed here from finished requests; gauges and token counters come from the
engine's own EngineMetrics at scrape time."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from dataclasses import dataclass, field

from engine.metrics import EngineMetrics
from engine.text import RequestOutput

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


@dataclass(slots=True)
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last one is +Inf
    sum: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, labels: str) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for le, n in zip([*map(repr, self.buckets), "+Inf"], self.counts):
            total += n
            out.append(f'{self.name}_bucket{{{labels},le="{le}"}} {total}')
        out += [f"{self.name}_sum{{{labels}}} {self.sum!r}", f"{self.name}_count{{{labels}}} {total}"]
        return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass(slots=True)
class ServerMetrics:
    model_name: str
    ttft: Histogram = field(
        default_factory=lambda: Histogram(
            "minisgl:time_to_first_token_seconds", "Time to first token (arrival to first token).", TTFT_BUCKETS
        )
    )
    itl: Histogram = field(
        default_factory=lambda: Histogram(
            "minisgl:inter_token_latency_seconds", "Time between consecutive output tokens of a request.", ITL_BUCKETS
        )
    )
    e2e: Histogram = field(
        default_factory=lambda: Histogram(
            "minisgl:e2e_request_latency_seconds", "Arrival to finish of a request.", E2E_BUCKETS
        )
    )
    finished: Counter = field(default_factory=Counter)  # finish_reason -> requests
    rejected: int = 0  # 429s from admission control

    def observe(self, out: RequestOutput, seen: int) -> int:
        """Record a request's latencies as its outputs arrive, as vLLM does: TTFT with its first token, each
        inter-token gap with the token that ends it, the end-to-end latency when it finishes (they were all recorded
        at the finish, so a long stream was missing from the histograms until it ended). `seen`: how many of its
        token times an earlier call recorded; returns the count for the next."""
        times = out.token_times
        if seen == 0 and out.ttft is not None:
            self.ttft.observe(out.ttft)
        for i in range(max(seen, 1), len(times)):
            self.itl.observe(times[i] - times[i - 1])
        if out.finished:
            self.e2e.observe((times[-1] if times else time.perf_counter()) - out.arrival)
            self.finished[out.finish_reason or "unknown"] += 1
        return len(times)

    def render(self, engine: EngineMetrics | None, in_flight: int, engine_age: float = 0.0) -> str:
        """engine: the engine's last snapshot (None: the engine is gone), taken engine_age seconds ago."""
        labels = f'model_name="{_label(self.model_name)}"'
        lines: list[str] = []
        declared: set[str] = set()

        def scalar(kind: str, name: str, help: str, value: float, extra: str = "") -> None:
            if name not in declared:
                declared.add(name)
                lines.extend([f"# HELP {name} {help}", f"# TYPE {name} {kind}"])
            lines.append(f"{name}{{{labels}{extra}}} {value!r}")

        if engine is not None:  # None: the engine loop is gone, only the server's own numbers remain
            scalar(
                "gauge",
                "minisgl:engine_metrics_age_seconds",
                "Age of the engine figures below (the engine answers between steps; during a long one, the last).",
                engine_age,
            )
            scalar("gauge", "minisgl:num_requests_running", "Requests in the engine's running batch.", engine.running)
            scalar("gauge", "minisgl:num_requests_waiting", "Requests waiting to be scheduled.", engine.waiting)
            scalar(
                "gauge",
                "minisgl:kv_cache_usage_perc",
                "Fraction of KV pages in use by live requests (0-1).",
                engine.kv_usage,
            )
            scalar(
                "gauge",
                "minisgl:kv_cache_pages_evictable",
                "KV pages held only by the prefix cache.",
                engine.kv_pages_cached,
            )
            scalar("gauge", "minisgl:kv_cache_pages_free", "Free KV pages.", engine.kv_pages_free)
            scalar(
                "counter",
                "minisgl:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
                engine.prompt_tokens,
            )
            scalar(
                "counter",
                "minisgl:prefix_cache_hits_total",
                "Prompt tokens served from the prefix cache.",
                engine.cache_hit_tokens,
            )
            scalar(
                "counter",
                "minisgl:prompt_tokens_total",
                "Prompt tokens of the requests admitted to run (a request aborted mid-prefill included).",
                engine.prompt_tokens,
            )
            scalar("counter", "minisgl:generation_tokens_total", "Tokens generated.", engine.generation_tokens)
            scalar(
                "counter",
                "minisgl:num_preemptions_total",
                "Requests preempted and recomputed later.",
                engine.preemptions,
            )
        scalar("gauge", "minisgl:num_requests_in_flight", "HTTP requests admitted and not yet finished.", in_flight)
        scalar(
            "counter", "minisgl:requests_rejected_total", "Requests refused by admission control (429).", self.rejected
        )
        for reason in sorted(self.finished) or ["stop"]:
            scalar(
                "counter",
                "minisgl:request_success_total",
                "Finished requests by finish reason.",
                self.finished[reason],
                f',finished_reason="{_label(reason)}"',
            )
        for h in (self.ttft, self.itl, self.e2e):
            lines += h.lines(labels)
        return "\n".join(lines) + "\n"
