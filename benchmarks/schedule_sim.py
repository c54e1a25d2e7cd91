"""Issue #15's replay through the engine's own scheduler and KV cache on a simulated clock (CPU: no model, no GPU), to
rank scheduling policies before a GPU run. Usage:

    python benchmarks/schedule_sim.py STEPS.jsonl[.gz] ... [--modes nomixed,mixed,step17] [--json out.json]

STEPS are `bench-trace --step-log` files of one machine (e.g. benchmarks/results/session25/h200_trace_ab/, unpacked).
Their consecutive busy steps give three laws, gap = a + b x context tokens read + c x prefill tokens (with logs that
have them, the decode rows' context and the prefill rows' query-key pairs instead of the context), one each for
decode-only, mixed and prefill-only steps, each with its own residuals. The simulated replay draws each step's gap
from its law plus a residual of that law drawn at random. The scheduler, the KV pages and the radix cache are the
engine's (engine/scheduler.py, kvcache/), and so is overlap scheduling's order: step N+1 is scheduled before step N's
tokens are known.

What it leaves out: whatever the law does not capture (the host's pace only as far as it shows in the gaps; a step's
cost beyond its context and prefill tokens, such as a chunk's attention over a long prefix). The first check is that
it reproduces the measured runs of the modes the logs came from.

Modes: nomixed (prefill first), mixed (the default), mpN (--mixed-prefill-tokens N), capN (--max-running-tokens
N x 1000), combined with '+' (e.g. mp512+cap700). The twenty-fifth session's sweep also had stepN (--mixed-step-ms N,
a share sized by a fit of the engine's step times, removed after this sweep: benchmarks/results/session25/sim/)."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.request import Req, Status  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.scheduler import Batch, Scheduler  # noqa: E402
from kvcache.manager import CacheManager  # noqa: E402
from minisgl_cli.bench_trace import plan  # noqa: E402
from minisgl_cli.replay import RequestResult  # noqa: E402
from minisgl_cli.run_figures import summarize  # noqa: E402
from minisgl_cli.trace_reader import read_trace  # noqa: E402


@dataclass
class Law:
    coef: np.ndarray  # seconds per unit of each feature (features())
    residuals: np.ndarray

    def gap(self, x: list[float], rng: np.random.Generator) -> float:
        return max(float(np.dot(self.coef, x)) + float(rng.choice(self.residuals)), 1e-4)


def features(step: dict, detailed: bool) -> list[float]:
    """A step's law inputs: 1, the KV read and the prefill tokens; with a detailed log (decode_context_tokens and
    prefill_key_pairs, from the twenty-fifth session on) the decode rows' context, the prefill tokens and the prefill
    rows' query-key pairs instead."""
    if detailed:
        return [1.0, step["decode_context_tokens"], step["prefill_tokens"], step["prefill_key_pairs"]]
    return [1.0, step["context_tokens"], step["prefill_tokens"]]


def batch_step(b: Batch) -> dict:
    """A scheduled batch as its step log record counts it (engine.engine.Engine._record)."""
    return dict(
        context_tokens=b.context_tokens,
        prefill_tokens=b.num_tokens - b.num_decode,
        decode_context_tokens=b.decode_context_tokens,
        prefill_key_pairs=b.prefill_key_pairs,
    )


def step_kind(decode_rows: int, prefill_rows: int) -> str:
    return "prefill" if not decode_rows else "mixed" if prefill_rows else "decode"


def fit_laws(paths: list[Path]) -> tuple[dict[str, Law], bool]:
    logs = []
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            logs.append([json.loads(line) for line in f])
    detailed = all("prefill_key_pairs" in s for steps in logs for s in steps)
    rows: dict[str, tuple[list, list]] = {"decode": ([], []), "mixed": ([], []), "prefill": ([], [])}
    for steps in logs:
        for prev, s in zip(steps, steps[1:]):
            gap = s["t"] - prev["t"]
            if gap < 0.2:  # longer: the engine idled (no work), not a step time
                xs, ys = rows[step_kind(s["decode_rows"], s["prefill_rows"])]
                xs.append(features(s, detailed))
                ys.append(gap)
    names = ["ms", "ms/100k context", "ms/1k prefill"]
    if detailed:
        names = ["ms", "ms/100k decode context", "ms/1k prefill", "ms/1M prefill pairs"]
    laws = {}
    for kind, (xs, ys) in rows.items():
        x, y = np.asarray(xs, dtype=float), np.asarray(ys)
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        laws[kind] = Law(coef, y - x @ coef)
        terms = " + ".join(f"{c * k:.2f} {n}" for c, k, n in zip(coef, (1e3, 1e8, 1e6, 1e9), names))
        p99 = np.quantile(np.abs(laws[kind].residuals), 0.99) * 1e3
        print(f"law, {kind} steps (n={len(y)}): {terms}, |residual| p99 {p99:.1f} ms")
    return laws, detailed


def scheduler_for(mode: str, num_pages: int, page: int) -> Scheduler:
    mixed, mixed_prefill, cap = True, 1024, None
    for part in mode.split("+"):
        if part == "nomixed":
            mixed = False
        elif part.startswith("mp"):
            mixed_prefill = int(part[2:])
        elif part.startswith("cap"):
            cap = int(part[3:]) * 1000
        elif part != "mixed":
            raise SystemExit(f"unknown mode part {part!r}")
    return Scheduler(CacheManager(num_pages, page), 256, 8192, mixed, cap, mixed_prefill)


def replay(
    items: list, sched: Scheduler, laws: dict[str, Law], detailed: bool, seed: int
) -> tuple[list[RequestResult], int]:
    rng = np.random.default_rng(seed)
    pending = sorted(items, key=lambda it: it.arrival)
    reqs: dict[int, Req] = {}
    now, at, steps = 0.0, 0, 0
    inflight: tuple[Batch, float] | None = None  # a batch on the GPU, and when its tokens arrive
    while at < len(pending) or sched.has_work() or inflight:
        while at < len(pending) and pending[at].arrival <= now:
            it = pending[at]
            req = Req(str(it.index), list(it.prompt), SamplingParams(max_tokens=it.output_len, ignore_eos=True))
            req.arrival = it.arrival
            reqs[it.index] = req
            sched.add(req)
            at += 1
        batch = sched.schedule()
        if batch is not None:
            steps += 1
            for i in batch.prefill_rows:
                sched.cache.publish(batch.reqs[i])
            law = laws[step_kind(batch.num_decode, len(batch.reqs) - batch.num_decode)]
            gap = law.gap(features(batch_step(batch), detailed), rng)
            done = (inflight[1] if inflight else now) + gap
        if inflight is not None:
            b, now = inflight
            for req, sample in zip(b.reqs, b.sample):
                if sample and req.status is not Status.FINISHED:
                    req.output_ids.append(0)
                    req.token_times.append(now)
                    if len(req.output_ids) >= req.max_tokens:
                        sched.finish(req, "length")
        inflight = (batch, done) if batch is not None else None
        if inflight is None and sched.has_work() and batch is None:
            raise SystemExit("the scheduler has work but gives no batch: a request the pool cannot hold?")
        if inflight is None and not sched.has_work() and at < len(pending):
            now = max(now, pending[at].arrival)  # idle until the next arrival
    assert sched.cache.num_in_use == 0, "pages still held after the replay"
    results = []
    for it in items:
        req = reqs[it.index]
        r = RequestResult(it.index, it.line, len(it.prompt), it.output_len, scheduled=it.arrival, sent=it.arrival)
        r.set_times(req.token_times)
        r.output_tokens = len(req.token_times)
        results.append(r)
    return results, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("steps", nargs="+", type=Path)
    ap.add_argument("--modes", default="nomixed,mixed")
    ap.add_argument("--trace", type=Path, default=Path(__file__).resolve().parents[1] / "traces/qwen_1000.jsonl")
    ap.add_argument("--time-scale", type=float, default=0.2)
    ap.add_argument("--pool-tokens", type=int, default=1_033_600, help="the measured run's KV pool (H200: 1,033,600)")
    ap.add_argument("--seeds", type=int, default=1, help="runs per mode, each with its own residual draws")
    ap.add_argument("--requests", type=int, help="the trace's first N requests (default: all)")
    ap.add_argument(
        "--context-cost",
        type=float,
        default=1.0,
        help="what if: the laws' cost per token of context (decode and mixed steps) times this (0.8: attention that "
        "reads shared prefixes once, if it took a fifth off)",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    laws, detailed = fit_laws(args.steps)
    for kind in ("decode", "mixed"):
        laws[kind].coef[1] *= args.context_cost
    page = 16
    flags = dict(length_scale=1.0, max_input_len=None, max_output_len=None, seed=0, time_scale=args.time_scale)
    window = read_trace(args.trace).window(0, args.requests)
    items = list(plan(window, 151_936, min(40_960, args.pool_tokens), flags).items)  # Qwen3-0.6B's vocabulary, context
    out = []
    for mode in args.modes.split(","):
        for seed in range(args.seeds):
            sched = scheduler_for(mode, args.pool_tokens // page, page)
            results, steps = replay(items, sched, laws, detailed, seed)
            duration = max(t for r in results for t in ([r.scheduled + r.e2e] if r.e2e is not None else []))
            res = summarize(results, duration, e2e_name="e2e_latency")
            res.update(mode=mode, seed=seed, engine_steps=steps, preemptions=sched.num_preemptions)
            out.append(res)
            ttft = " ".join(f"{res[k]:6.0f}" for k in ("median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"))
            tbt = " ".join(f"{res[k]:5.1f}" for k in ("median_itl_ms", "p90_itl_ms", "p99_itl_ms", "max_itl_ms"))
            print(
                f"{mode:16} seed {seed}  out {res['output_throughput']:7.0f} tok/s  TTFT p50/p90/p99 {ttft} ms  "
                f"TBT p50/p90/p99/max {tbt} ms  steps {steps}",
                flush=True,
            )
    if args.json:
        fitted = {k: dict(coef=law.coef.tolist(), residual_p99=float(np.quantile(np.abs(law.residuals), 0.99)))
                  for k, law in laws.items()}  # fmt: skip
        Path(args.json).write_text(json.dumps(dict(laws=fitted, runs=out), indent=1))


if __name__ == "__main__":
    main()
