"""How many streamed tokens per second `serve`'s HTTP front end delivers, with no model in the way.

The real engine loop (engine/engine_loop.py) drives a model-less engine that gives every running request one token
per step of --step-ms; the real front-end process serves them; bench-serve (the project's client) streams them.
If the front end keeps up, every stream sees one token per step (TBT p50 = the step) and the output rate is
running requests / step; a front end that falls behind delivers tokens in bursts (TBT p50 far below the step,
p99 far above) and less than that rate.

    python benchmarks/frontend_capacity.py --streams 256 --step-ms 20 --tokens 400

--trace replays a request trace through bench-trace instead (its prompts' lengths and arrivals; every running request
still gets one token per step), e.g. issue #15's saturating replay, where the front end's own pauses show as the
inter-token gap's tail and maximum above the constant step:

    python benchmarks/frontend_capacity.py --trace traces/qwen_1000.jsonl --time-scale 0.2 --step-ms 16
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import cast

from engine.engine import Engine
from engine.ipc import EngineInfo
from engine.limits import RequestLimits
from engine.metrics import EngineMetrics
from engine.request import Req, Status
from engine.sampling_params import SamplingParams


class FakeEngine:
    """What EngineLoop needs of an Engine: requests in, one token per running request every step."""

    def __init__(self, step_s: float):
        self.step_s = step_s
        self.reqs: dict[str, Req] = {}
        self.ended: list[Req] = []
        self.steps = 0

    def has_work(self) -> bool:
        return bool(self.reqs or self.ended)

    def add_request(self, ids: list[int], params: SamplingParams, rid: str) -> Req:
        req = self.reqs[rid] = Req(rid, list(ids), params)
        req.status = Status.RUNNING
        return req

    def abort(self, rid: str, reason: str = "abort") -> None:
        req = self.reqs.pop(rid, None)
        if req is not None:
            req.status, req.finish_reason = Status.FINISHED, reason
            self.ended.append(req)

    def step(self) -> list[Req]:
        time.sleep(self.step_s)
        self.steps += 1
        changed, self.ended = self.ended, []
        for req in list(self.reqs.values()):
            req.output_ids.append(300 + len(req.output_ids) % 1000)  # ids >= 256 decode as "<id>" (ByteTokenizer)
            if len(req.output_ids) >= req.max_tokens:
                req.status, req.finish_reason = Status.FINISHED, "length"
                del self.reqs[req.rid]
            changed.append(req)
        return changed

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(len(self.reqs), 0, 1, 0, 0, 1, 16, 0, 0, 0, 0, 0, self.steps)


def engine_main(port: int, step_ms: float) -> None:
    from minisgl_cli.serve import serve_engine
    from minisgl_cli.server.frontend_spec import FrontendSpec

    info = EngineInfo("fake", "none", "none", "none", 1, 4096, RequestLimits(1 << 16, 1 << 20, 1 << 30))
    spec = FrontendSpec("dummy:tiny-llama", None, "127.0.0.1", port, "fake", None, "warning", os.getpid())
    serve_engine(cast(Engine, FakeEngine(step_ms / 1000)), info, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--trace", default=None, help="replay this trace (bench-trace) instead of bench-serve's load")
    ap.add_argument("--time-scale", type=float, default=1.0, help="with --trace")
    ap.add_argument("--port", type=int, default=8321)
    ap.add_argument("--json", default=None)
    ap.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)  # the child that runs the fake engine
    a = ap.parse_args()
    if a.engine:
        return engine_main(a.port, a.step_ms)
    engine = subprocess.Popen(
        [sys.executable, __file__, "--engine", "--port", str(a.port), "--step-ms", str(a.step_ms)]
    )
    out = a.json or f"/tmp/frontend_capacity_{os.getpid()}.json"
    try:
        served = ["--url", f"http://127.0.0.1:{a.port}", "--vocab-size", "256", "--max-model-len", "100000"]
        served += ["--quiet", "--json", out]
        if a.trace:
            load = ["bench-trace", a.trace, "--time-scale", str(a.time_scale), "--no-client-check"]
        else:
            load = ["bench-serve", "--input-len", "8:8", "--output-len", f"{a.tokens}:{a.tokens}"]
            load += ["--max-concurrency", str(a.streams), "--num-requests", str(2 * a.streams)]
        bench = [sys.executable, "-m", "minisgl_cli", *load, *served]
        for _ in range(100):  # the front end comes up
            if (
                subprocess.run(["curl", "-sf", f"http://127.0.0.1:{a.port}/health"], capture_output=True).returncode
                == 0
            ):
                break
            time.sleep(0.2)
        subprocess.run(bench, check=True, stdout=subprocess.DEVNULL)
    finally:
        engine.send_signal(signal.SIGINT)
        engine.wait(timeout=20)
    r = json.load(open(out))
    row = r["runs"][0] if "runs" in r else r
    if a.trace:
        print(
            f"{a.trace} at {a.time_scale}x the recorded gaps, step {a.step_ms} ms: delivered "
            f"{row['output_throughput']:,.0f} tok/s; TBT p50 {row['median_itl_ms']:.1f} ms, p99 "
            f"{row['p99_itl_ms']:.1f} ms, max {row['max_itl_ms']:.1f} ms; TTFT p99 {row['p99_ttft_ms']:.1f} ms"
        )
        return
    ideal = a.streams / (a.step_ms / 1000)
    print(
        f"streams {a.streams}, step {a.step_ms} ms: ideal {ideal:,.0f} tok/s; delivered "
        f"{row['output_throughput']:,.0f} tok/s ({row['output_throughput'] / ideal:.0%}); "
        f"TBT p50 {row['median_itl_ms']:.1f} ms, p99 {row['p99_itl_ms']:.1f} ms"
    )


if __name__ == "__main__":
    main()
