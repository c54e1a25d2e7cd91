"""Summarize `bench-trace --step-log` files: the gap between consecutive steps' tokens (what a running stream waits
per token) by step kind, and a least-squares step-time model gap = a + b * KV tokens read + c * prefill tokens.
Usage: python benchmarks/step_log_summary.py steps_A.jsonl [steps_B.jsonl ...] [--json out.json]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def pct(xs: list[float], q: float) -> float:
    return float(torch.tensor(xs).quantile(q)) if xs else float("nan")


def summarize(path: Path) -> dict:
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    rows = []
    for prev, s in zip(steps, steps[1:]):
        if "process_ms" in s:  # the gap less the engine's own time in it: the caller's loop, or the thread not running
            engine_ms = prev["process_ms"] + s["schedule_ms"] + s["launch_ms"] + s["wait_ms"]
            s = {**s, "between_ms": (s["t"] - prev["t"]) * 1e3 - engine_ms}
        rows.append((s["t"] - prev["t"], s))
    out: dict = {"file": path.name, "steps": len(steps)}
    for kind, keep in (
        ("all", lambda s: True),
        ("decode only", lambda s: s["prefill_rows"] == 0),
        ("mixed", lambda s: s["decode_rows"] > 0 and s["prefill_rows"] > 0),
        ("prefill only", lambda s: s["decode_rows"] == 0),
    ):
        gaps = [g * 1e3 for g, s in rows if keep(s)]
        out[kind] = {
            "n": len(gaps),
            "gap_ms_p50": pct(gaps, 0.5),
            "gap_ms_p90": pct(gaps, 0.9),
            "gap_ms_p99": pct(gaps, 0.99),
            "gap_ms_max": max(gaps, default=float("nan")),
            "mean_decode_rows": sum(s["decode_rows"] for _, s in rows if keep(s)) / max(len(gaps), 1),
            "mean_kv_tokens": sum(s["context_tokens"] for _, s in rows if keep(s)) / max(len(gaps), 1),
            "mean_prefill_tokens": sum(s["prefill_tokens"] for _, s in rows if keep(s)) / max(len(gaps), 1),
        }
    busy = [(g, s) for g, s in rows if g < 0.2]  # idle gaps (no work) are not step times
    if len(busy) > 3:
        x = torch.tensor([[1.0, s["context_tokens"] / 1e5, s["prefill_tokens"] / 1e3] for _, s in busy])
        y = torch.tensor([g * 1e3 for g, _ in busy])
        coef = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1).tolist()
        resid = y - x @ torch.tensor(coef)
        out["model"] = {
            "fixed_ms": coef[0],
            "ms_per_100k_kv_tokens": coef[1],
            "ms_per_1k_prefill_tokens": coef[2],
            "residual_ms_p99": pct(resid.abs().tolist(), 0.99),
        }
        # The slowest tenth of the steps against the model: what the engine's CPU did while they ran.
        cpu: tuple[str, ...] = ("schedule_ms", "launch_ms", "wait_ms", "process_ms")
        for extra in (
            ("device_allocs", "alloc_retries"),
            ("launch_cpu_ms", "between_ms"),
            ("voluntary_switches", "involuntary_switches"),
        ):
            if all(k in busy[0][1] for k in extra):
                cpu += extra
        if all(k in busy[0][1] for k in cpu[:4]):
            order = sorted(range(len(busy)), key=lambda i: float(resid[i]))
            cut = len(order) * 9 // 10
            for name, idx in (("typical steps", order[:cut]), ("slowest tenth", order[cut:])):
                out[name] = {k: sum(busy[i][1][k] for i in idx) / len(idx) for k in cpu}
                out[name]["gap_ms"] = sum(busy[i][0] * 1e3 for i in idx) / len(idx)
    return out


def main() -> None:
    args = sys.argv[1:]
    json_out = None
    if "--json" in args:
        i = args.index("--json")
        json_out = args[i + 1]
        del args[i : i + 2]
    res = [summarize(Path(a)) for a in args]
    for r in res:
        print(f"{r['file']}: {r['steps']} steps")
        for kind in ("all", "decode only", "mixed", "prefill only"):
            k = r[kind]
            print(
                f"  {kind:13} n={k['n']:6} gap p50/p90/p99/max {k['gap_ms_p50']:6.2f} {k['gap_ms_p90']:6.2f} "
                f"{k['gap_ms_p99']:6.2f} {k['gap_ms_max']:7.1f} ms  rows {k['mean_decode_rows']:5.0f}  KV "
                f"{k['mean_kv_tokens']:9.0f}  prefill {k['mean_prefill_tokens']:6.0f}"
            )
        if "model" in r:
            m = r["model"]
            print(
                f"  model: {m['fixed_ms']:.2f} ms + {m['ms_per_100k_kv_tokens']:.2f} ms/100k KV tokens + "
                f"{m['ms_per_1k_prefill_tokens']:.2f} ms/1k prefill tokens (|residual| p99 {m['residual_ms_p99']:.1f})"
            )
        for name in ("typical steps", "slowest tenth"):
            if name in r:
                c = r[name]
                print(
                    f"  {name:14} gap {c['gap_ms']:6.2f} ms; engine CPU: schedule {c['schedule_ms']:5.2f} launch "
                    f"{c['launch_ms']:5.2f} wait {c['wait_ms']:5.2f} process {c['process_ms']:5.2f} ms"
                    + (
                        f"; per step {c['device_allocs']:.2f} device allocations, {c['alloc_retries']:.2f} retries"
                        if "device_allocs" in c
                        else ""
                    )
                    + (
                        f"; launch thread CPU {c['launch_cpu_ms']:5.2f} ms; between steps {c['between_ms']:5.2f} ms"
                        if "launch_cpu_ms" in c
                        else ""
                    )
                    + (
                        f"; context switches {c['voluntary_switches']:.1f} voluntary, "
                        f"{c['involuntary_switches']:.1f} involuntary"
                        if "voluntary_switches" in c
                        else ""
                    )
                )
    if json_out:
        Path(json_out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
