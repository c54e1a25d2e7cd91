"""The KV/scheduler panel from a server's Prometheus /metrics: minisgl's, vLLM's or SGLang's metric names."""

from __future__ import annotations

from typing import Any

from minisgl_cli.prometheus import cache_counters, counter, parse_prometheus
from minisgl_cli.tui.stats import Load


def _int(v: float | None) -> int | None:
    return None if v is None else round(v)


def _vllm_style_counts(m: dict[str, float], prefix: str) -> dict[str, Any]:
    """The request and token counters minisgl exports under vLLM's names (its own prefix)."""
    hits, queries = cache_counters(m) or (None, None)
    return dict(
        running=_int(m.get(f"{prefix}:num_requests_running")),
        waiting=_int(m.get(f"{prefix}:num_requests_waiting")),
        finished_requests=_int(counter(m, f"{prefix}:request_success")),
        preemptions=_int(counter(m, f"{prefix}:num_preemptions")),
        prompt_tokens=_int(counter(m, f"{prefix}:prompt_tokens")),
        cache_hit_tokens=_int(hits),
        generation_tokens=_int(counter(m, f"{prefix}:generation_tokens")),
        cache_hit_rate=hits / queries if hits is not None and queries else None,
    )


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
        return Load("minisgl", usage, in_use, _int(cached), _int(free), total, **_vllm_style_counts(m, "minisgl"))
    if "vllm:num_requests_running" in m:
        usage = m.get("vllm:kv_cache_usage_perc", m.get("vllm:gpu_cache_usage_perc"))
        return Load("vllm", usage, **_vllm_style_counts(m, "vllm"))
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
            prompt_tokens=_int(counter(m, "sglang:prompt_tokens")),
            generation_tokens=_int(counter(m, "sglang:generation_tokens")),
            cache_hit_rate=m.get("sglang:cache_hit_rate"),
        )
    return None
