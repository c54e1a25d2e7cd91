"""Replaying timed requests: in-process through AsyncLLM, or against an OpenAI-compatible /v1/completions URL.
Both drivers sleep until each request's (scaled) arrival time and record per-request timings."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

OnDone = Callable[["RequestResult"], None]


@dataclass(slots=True)
class ReplayItem:
    index: int
    line: int
    arrival: float  # seconds from the replay's start (already scaled)
    prompt: list[int]
    output_len: int


@dataclass(slots=True)
class RequestResult:
    index: int
    line: int
    input_len: int
    expected_output: int
    start: float = 0.0  # perf_counter when sent
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)  # gaps between token (or chunk) arrivals
    e2e: float | None = None
    output_tokens: int = 0
    cache_hit_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.e2e is None or self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


async def _wait_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


# ---- in-process ------------------------------------------------------------------------------------------
async def replay_local(
    async_llm, items: list[ReplayItem], temperature: float, on_done: OnDone | None = None
) -> list[RequestResult]:
    from engine.sampling_params import SamplingParams

    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()

    async def one(item: ReplayItem) -> RequestResult:
        res = RequestResult(item.index, item.line, len(item.prompt), item.output_len)
        await _wait_until(t0 + item.arrival)
        res.start = time.perf_counter()
        last = None
        try:
            params = SamplingParams(max_tokens=item.output_len, temperature=temperature, ignore_eos=True)
            async for out in async_llm.submit(item.prompt, params, loop=loop):
                last = out
        except Exception as e:  # a bad request (ValueError) or a dead engine fails this request only
            res.error = f"{type(e).__name__}: {e}"
        if last is not None:
            times = last.token_times
            res.output_tokens, res.cache_hit_tokens = len(last.token_ids), last.cache_hit_tokens
            if times:
                res.ttft, res.e2e = times[0] - res.start, times[-1] - res.start
                res.itls = [b - a for a, b in zip(times, times[1:])]
            if last.finish_reason not in ("length", "stop") and res.error is None:
                res.error = f"finished with {last.finish_reason}: {last.error or ''}".strip()
        if on_done:
            on_done(res)
        return res

    return list(await asyncio.gather(*(one(i) for i in items)))


# ---- OpenAI-compatible server ------------------------------------------------------------------------------
def api_base(url: str) -> str:
    """'http://host:port', '.../v1' or '.../v1/' -> 'http://host:port/v1'."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


async def served_model(client, base: str) -> str:
    r = await client.get(base + "/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise ValueError(f"{base}/models lists no model: pass --served-model")
    return data[0]["id"]


async def replay_url(
    client, base: str, model: str, items: list[ReplayItem], temperature: float, on_done: OnDone | None = None
) -> list[RequestResult]:
    """Streams /v1/completions with token-id prompts; each SSE chunk carrying a choice is timed as it arrives.
    Output tokens come from the final usage chunk when the server sends one, else from the chunk count."""
    t0 = time.perf_counter()

    async def one(item: ReplayItem) -> RequestResult:
        res = RequestResult(item.index, item.line, len(item.prompt), item.output_len)
        body = {
            "model": model,
            "prompt": item.prompt,
            "max_tokens": item.output_len,
            "temperature": temperature,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        await _wait_until(t0 + item.arrival)
        res.start = time.perf_counter()
        times: list[float] = []
        usage = None
        try:
            async with client.stream("POST", base + "/completions", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    raise RuntimeError(f"HTTP {resp.status_code}: {text[:300]}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    now = time.perf_counter()
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        raise RuntimeError(f"server error: {chunk['error']}")
                    if chunk.get("choices"):
                        times.append(now)
                    usage = chunk.get("usage") or usage
        except Exception as e:
            res.error = f"{type(e).__name__}: {e}"
        res.output_tokens = int(usage["completion_tokens"]) if usage else len(times)
        if times:
            res.ttft, res.e2e = times[0] - res.start, times[-1] - res.start
            res.itls = [b - a for a, b in zip(times, times[1:])]
        elif res.error is None:
            res.error = "the stream carried no tokens"
        if on_done:
            on_done(res)
        return res

    return list(await asyncio.gather(*(one(i) for i in items)))


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN|[+-]Inf)\s*$")
# (hit tokens, prompt tokens) counter pairs in the /metrics of known servers; this project's first.
CACHE_COUNTERS = [
    ("minisgl:prefix_cache_hits", "minisgl:prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
    ("sglang:cached_tokens", "sglang:prompt_tokens"),
]


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of every sample per metric name, with a trailing `_total` dropped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m:
            name = m.group(1).removesuffix("_total")
            out[name] = out.get(name, 0.0) + float(m.group(3))
    return out


async def scrape_metrics(client, root: str) -> dict[str, float] | None:
    try:
        r = await client.get(root + "/metrics")
    except Exception:
        return None
    return parse_prometheus(r.text) if r.status_code == 200 else None


def cache_hit_rate(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Hit tokens / prompt tokens over the replay, from counters scraped before and after (None if unknown)."""
    if not before or not after:
        return None
    for hits, prompts in CACHE_COUNTERS:
        if hits in after and prompts in after:
            d_prompt = after[prompts] - before.get(prompts, 0.0)
            return (after[hits] - before.get(hits, 0.0)) / d_prompt if d_prompt > 0 else None
    return None
