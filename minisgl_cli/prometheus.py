"""A server's Prometheus /metrics text as numbers: one reader for the replay's cache-hit figure (replay.py) and the
chat's load panel (tui/prom.py), whichever server (minisgl, vLLM, SGLang) wrote it."""

from __future__ import annotations

import math
import re

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(\S+)")
# (hit tokens, prompt tokens) counters of the prefix cache in known servers' /metrics; this project's first.
CACHE_COUNTERS = (
    ("minisgl:prefix_cache_hits", "minisgl:prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
    ("sglang:cached_tokens", "sglang:prompt_tokens"),
)


def parse_prometheus(text: str) -> dict[str, float]:
    """metric name -> value, summed over label sets; histogram series keep their _bucket/_sum/_count names, counters
    their _total; comments and values that are not finite numbers are skipped."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None:  # comments, blank lines
            continue
        try:
            value = float(match.group(2))
        except ValueError:
            continue
        if math.isfinite(value):
            values[match.group(1)] = values.get(match.group(1), 0.0) + value
    return values


def counter(metrics: dict[str, float], name: str) -> float | None:
    """A counter by its name without the `_total` that Prometheus clients add (some servers' exporters do not)."""
    return metrics.get(f"{name}_total", metrics.get(name))


def cache_counters(metrics: dict[str, float]) -> tuple[float, float] | None:
    """(hit tokens, prompt tokens) of the first known server's prefix-cache counters found."""
    for hits, prompts in CACHE_COUNTERS:
        h, p = counter(metrics, hits), counter(metrics, prompts)
        if h is not None and p is not None:
            return h, p
    return None
