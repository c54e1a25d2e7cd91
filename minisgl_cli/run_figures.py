"""From per-request timings to a run's figures: throughput and latency percentiles under vLLM/SGLang bench_serving
field names, goodput against latency targets (SLOs), the client's own load, and the knee of a sweep."""

from __future__ import annotations

import math
import re
from typing import Any

from minisgl_cli.replay import RequestResult
from minisgl_cli.report import latency_stats

SLO_METRICS = ("ttft", "tpot", "e2e")
KNEE_GAIN = 1.10  # a load step that adds less than 10% output throughput is past the knee
SLO_ATTAINMENT = 0.90  # a load misses its targets when fewer than 90% of its requests meet them


def parse_slo(text: str) -> dict[str, float]:
    """'ttft=200ms,tpot=40ms,e2e=2s' -> seconds per metric; a number without a unit is milliseconds (vLLM's
    `--goodput ttft:200`)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\w+)\s*[=:]\s*([0-9.]+(?:e-?\d+)?)\s*(ms|s)?", part)
        if not m or m.group(1) not in SLO_METRICS:
            raise ValueError(
                f"--slo takes {'/'.join(SLO_METRICS)}=<number>ms|s (no unit: ms) separated by commas, e.g. "
                "ttft=200ms,tpot=40ms "
                f"(got {part!r})"
            )
        try:
            value = float(m.group(2)) / (1000 if m.group(3) != "s" else 1)
        except ValueError:  # '1.2.3' matches the pattern
            raise ValueError(f"--slo {m.group(1)} takes a number (got {part!r})") from None
        if not 0 < value < math.inf:  # 1e999 reads as inf, which the JSON cannot hold
            raise ValueError(f"--slo {m.group(1)} must be a finite number > 0 (got {part!r})")
        if m.group(1) in out:  # the last one silently won
            raise ValueError(f"--slo names {m.group(1)} twice (got {text!r})")
        out[m.group(1)] = value
    if not out:
        raise ValueError("--slo names no target")
    return out


def meets(r: RequestResult, slo: dict[str, float]) -> bool:
    values = {"ttft": r.ttft, "tpot": r.tpot if r.output_tokens > 1 else 0.0, "e2e": r.e2e}
    return r.ok and all((x := values[k]) is not None and x <= v for k, v in slo.items())


def summarize(
    results: list[RequestResult], duration: float, e2e_name: str = "e2el", slo: dict[str, float] | None = None
) -> dict[str, Any]:
    """vLLM `bench serve` / SGLang `bench_serving` field names (latencies in ms, `median` = p50). bench-trace keeps
    its `e2e_latency` name, bench-serve uses vLLM's `e2el`."""
    ok = [r for r in results if r.ok]
    input_tokens = sum(r.input_len for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    duration = max(duration, 1e-9)
    out: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "expected_output_tokens": sum(r.expected_output for r in ok),
        "request_throughput": len(ok) / duration,
        "input_throughput": input_tokens / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
    }
    out["request_goodput"] = None  # without targets, as vLLM writes it
    if slo is not None:
        good = sum(meets(r, slo) for r in results)
        out.update(request_goodput=good / duration, goodput_fraction=good / len(results) if results else None)
    series = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [x for r in ok for x in r.itls],
        e2e_name: [r.e2e for r in ok if r.e2e is not None],
        "queue": [r.sent - r.scheduled for r in results if r.sent],
    }
    for name, values in series.items():
        for stat, v in latency_stats(values).items():
            out[f"{'median' if stat == 'p50' else stat}_{name}_ms"] = v
    out["errors"] = [{"index": r.index, "line": r.line, "error": r.error} for r in results if not r.ok][:20]
    return out


def per_request(results: list[RequestResult], t0: float, detailed: bool = False) -> dict[str, list]:
    """vLLM's per-request arrays (seconds), plus each request's scheduled send time from the run's start. Every
    request sent is in them, failed ones with what they got before failing; `success` says which succeeded, and only
    those count in `summarize`'s totals and latencies (sum(output_lens where success) == total_output_tokens).
    `indices` are the requests' places in the workload, which `errors` names: a run cut short holds only the requests
    that ended, so an array's position is not the request's index there."""
    out: dict[str, list] = {
        "indices": [r.index for r in results],
        "success": [r.ok for r in results],
        "input_lens": [r.input_len for r in results],
        "output_lens": [r.output_tokens for r in results],
        "send_times": [round(r.scheduled - t0, 6) for r in results],
        "ttfts": [None if r.ttft is None else round(r.ttft, 6) for r in results],
        "tpots": [None if r.tpot is None else round(r.tpot, 6) for r in results],
    }
    if detailed:
        out["itls"] = [[round(x, 6) for x in r.itls] for r in results]
    return out


def rate_bands(results: list[RequestResult], rates: list[float], bands: int) -> list[dict[str, Any]]:
    """A ramp's requests in `bands` groups of (nearly) as many requests, in the order of the rate each was sent at
    (`rates`, one per result): each group's range of rates, its completed and failed counts and its TTFT and TPOT
    p50/p99 (ms, of the completed), so where along the ramp latency turned up shows. A vLLM ramp sends as many
    requests at each step of its rate (or of its logarithm): the groups are equal steps along it."""
    order = sorted(range(len(results)), key=lambda k: (rates[k], results[k].index))
    k = min(bands, len(order))
    out = []
    for b in range(k):
        group = order[b * len(order) // k : (b + 1) * len(order) // k]
        ok = [results[j] for j in group if results[j].ok]
        ttft = latency_stats(r.ttft for r in ok if r.ttft is not None)
        tpot = latency_stats(r.tpot for r in ok if r.tpot is not None)
        out.append(
            {
                "from_rps": rates[group[0]],
                "to_rps": rates[group[-1]],
                "completed": len(ok),
                "failed": len(group) - len(ok),
                "median_ttft_ms": ttft["p50"],
                "p99_ttft_ms": ttft["p99"],
                "median_tpot_ms": tpot["p50"],
                "p99_tpot_ms": tpot["p99"],
            }
        )
    return out


def token_times(r: RequestResult) -> list[float]:
    """When each of a request's tokens (or chunks) arrived, on its scheduled time's clock."""
    if r.ttft is None:
        return []
    t = r.scheduled + r.ttft
    out = [t]
    for gap in r.itls:
        t += gap
        out.append(t)
    return out


def token_rate_peak(results: list[RequestResult], window: float = 1.0) -> float:
    """Tokens (or events) per second received in the busiest `window` seconds of the run."""
    bins: dict[int, int] = {}
    start = min((r.scheduled for r in results), default=0.0)
    for r in results:
        for t in token_times(r):
            k = int((t - start) // window)
            bins[k] = bins.get(k, 0) + 1
    return max(bins.values(), default=0) / window


def client_usage(row: dict[str, Any], results: list[RequestResult], absorb: float | None) -> dict[str, Any]:
    """How much of the client's measured absorption rate this run used (mean and busiest second)."""
    if not absorb:
        return {"client_absorption_tok_s": None, "client_used_fraction": None, "client_peak_used_fraction": None}
    events = sum(len(r.itls) + 1 for r in results if r.ttft is not None)
    return {
        "client_absorption_tok_s": absorb,
        "client_used_fraction": events / row["duration"] / absorb,
        "client_peak_used_fraction": token_rate_peak(results, min(1.0, row["duration"])) / absorb,
    }


def mark_knee(rows: list[dict[str, Any]]) -> int | None:
    """Index of the knee of a sweep (rows in increasing load): the last load before output throughput stops growing
    (the next step adds < 10%), before the SLO attainment falls under 90%, or before a load that reached
    --max-errors (its figures cover a run cut short, no measurement of that load: the loads past it are not
    compared). Sets row['knee'] and its reason."""
    knee, why = None, None
    for i, row in enumerate(rows):
        if row.get("stop_reason") == "max_errors":
            knee, why = (i - 1, "max_errors") if i else (None, "max_errors")
            break
        attain = row.get("goodput_fraction")
        if attain is not None and attain < SLO_ATTAINMENT:
            knee, why = (i - 1, "slo") if i else (None, "slo")
            break
        if i and row["output_throughput"] < KNEE_GAIN * rows[i - 1]["output_throughput"]:
            knee, why = i - 1, "throughput"
            break
    for i, row in enumerate(rows):
        row["knee"] = i == knee
        row["knee_reason"] = why if i == knee else None
    return knee


def stop_why(row: dict[str, Any]) -> str | None:
    """Why a load stopped early (--max-errors, Ctrl-C), in words; None for a load that ran to its end."""
    return {"max_errors": "max errors", "interrupted": "interrupted"}.get(str(row.get("stop_reason")))


def load_name(row: dict[str, Any]) -> str:
    """A load's name, with why it stopped early where it did (--max-errors, Ctrl-C): its figures then cover a run cut
    short, no measurement of that load, which a table or plot that shows them must say."""
    why = stop_why(row)
    return f"{row['load']} ({why})" if why else str(row["load"])


SWEEP_ORDER = {"synchronous": 0, "throughput": 2}  # a --rate sweep's rate loads lie between, by rate


def by_load(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A --rate sweep's rows in increasing load (synchronous, its rates, throughput), as the knee and the plots read
    them: they ran, and are listed, in guidellm's order (synchronous, throughput, then the rates). Other rows as
    they are (already in increasing load)."""
    if not all(isinstance(r.get("strategy"), str) for r in rows):
        return list(rows)

    def key(row: dict[str, Any]) -> tuple[int, float]:
        rate = row.get("request_rate")
        return SWEEP_ORDER.get(row["strategy"], 1), rate if isinstance(rate, (int, float)) else math.inf

    return sorted(rows, key=key)


def load_sort_key(rate: float, concurrency: int | None) -> tuple[float, float]:
    return (rate, math.inf if concurrency is None else concurrency)
