"""The KV/scheduler panel from a server's Prometheus /metrics: minisgl's, vLLM's or SGLang's metric names."""

from __future__ import annotations

import math
import re

from minisgl_cli.tui.stats import Load

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """metric name -> value, summed over label sets (histogram series keep their _bucket/_sum/_count names)."""
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


def _int(v: float | None) -> int | None:
    return None if v is None else round(v)


def load_from_metrics(text: str) -> Load | None:
    """None when none of the known names are there."""
    m = parse_prometheus(text)
    if "minisgl:num_requests_running" in m:
        usage = m.get("minisgl:kv_cache_usage_perc")
        cached, free = m.get("minisgl:kv_cache_pages_evictable"), m.get("minisgl:kv_cache_pages_free")
        in_use = total = None
        if usage is not None and cached is not None and free is not None and usage < 1:
            # usage = in_use / total and total = in_use + cached + free
            in_use = round(usage * (cached + free) / (1 - usage))
            total = in_use + round(cached) + round(free)
        queries, hits = m.get("minisgl:prefix_cache_queries_total"), m.get("minisgl:prefix_cache_hits_total")
        return Load(
            "minisgl",
            usage,
            in_use,
            _int(cached),
            _int(free),
            total,
            running=_int(m.get("minisgl:num_requests_running")),
            waiting=_int(m.get("minisgl:num_requests_waiting")),
            finished_requests=_int(m.get("minisgl:request_success_total")),
            preemptions=_int(m.get("minisgl:num_preemptions_total")),
            prompt_tokens=_int(m.get("minisgl:prompt_tokens_total")),
            cache_hit_tokens=_int(hits),
            generation_tokens=_int(m.get("minisgl:generation_tokens_total")),
            cache_hit_rate=hits / queries if hits is not None and queries else None,
        )
    if "vllm:num_requests_running" in m:
        usage = m.get("vllm:kv_cache_usage_perc", m.get("vllm:gpu_cache_usage_perc"))
        queries, hits = m.get("vllm:prefix_cache_queries_total"), m.get("vllm:prefix_cache_hits_total")
        return Load(
            "vllm",
            usage,
            running=_int(m.get("vllm:num_requests_running")),
            waiting=_int(m.get("vllm:num_requests_waiting")),
            finished_requests=_int(m.get("vllm:request_success_total")),
            preemptions=_int(m.get("vllm:num_preemptions_total")),
            prompt_tokens=_int(m.get("vllm:prompt_tokens_total")),
            cache_hit_tokens=_int(hits),
            generation_tokens=_int(m.get("vllm:generation_tokens_total")),
            cache_hit_rate=hits / queries if hits is not None and queries else None,
        )
    if "sglang:num_running_reqs" in m:
        used, capacity = m.get("sglang:num_used_tokens"), m.get("sglang:max_total_num_tokens")
        return Load(
            "sglang",
            m.get("sglang:token_usage"),
            _int(used),
            None,
            _int(capacity - used) if used is not None and capacity is not None else None,
            _int(capacity),
            1,
            running=_int(m.get("sglang:num_running_reqs")),
            waiting=_int(m.get("sglang:num_queue_reqs")),
            prompt_tokens=_int(m.get("sglang:prompt_tokens_total")),
            generation_tokens=_int(m.get("sglang:generation_tokens_total")),
            cache_hit_rate=m.get("sglang:cache_hit_rate"),
        )
    return None
