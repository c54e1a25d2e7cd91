"""The KV/scheduler panel from a server's Prometheus /metrics: minisgl's, vLLM's or SGLang's metric names."""

from __future__ import annotations

from minisgl_cli.prometheus import cache_counters, counter, parse_prometheus
from minisgl_cli.tui.stats import Load


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
        hits, queries = cache_counters(m) or (None, None)
        return Load(
            "minisgl",
            usage,
            in_use,
            _int(cached),
            _int(free),
            total,
            running=_int(m.get("minisgl:num_requests_running")),
            waiting=_int(m.get("minisgl:num_requests_waiting")),
            finished_requests=_int(counter(m, "minisgl:request_success")),
            preemptions=_int(counter(m, "minisgl:num_preemptions")),
            prompt_tokens=_int(counter(m, "minisgl:prompt_tokens")),
            cache_hit_tokens=_int(hits),
            generation_tokens=_int(counter(m, "minisgl:generation_tokens")),
            cache_hit_rate=hits / queries if hits is not None and queries else None,
        )
    if "vllm:num_requests_running" in m:
        usage = m.get("vllm:kv_cache_usage_perc", m.get("vllm:gpu_cache_usage_perc"))
        hits, queries = cache_counters(m) or (None, None)
        return Load(
            "vllm",
            usage,
            running=_int(m.get("vllm:num_requests_running")),
            waiting=_int(m.get("vllm:num_requests_waiting")),
            finished_requests=_int(counter(m, "vllm:request_success")),
            preemptions=_int(counter(m, "vllm:num_preemptions")),
            prompt_tokens=_int(counter(m, "vllm:prompt_tokens")),
            cache_hit_tokens=_int(hits),
            generation_tokens=_int(counter(m, "vllm:generation_tokens")),
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
            prompt_tokens=_int(counter(m, "sglang:prompt_tokens")),
            generation_tokens=_int(counter(m, "sglang:generation_tokens")),
            cache_hit_rate=m.get("sglang:cache_hit_rate"),
        )
    return None
