"""Where a slow launch's time goes: runs a minisgl command (e.g. issue #15's bench-trace replay) in this process with
each runner launch (ModelRunner.run) split into phases and the engine thread's stack sampled while a launch is in
progress; prints, for the launches slower than --slow-ms, their phases and the source lines the samples fell on,
next to the same for the typical launches. Usage (GPU machine):
    python benchmarks/slow_launches.py --slow-ms 20 -- bench-trace traces/qwen_1000.jsonl --model dummy:Qwen3-0.6B \
        --time-scale 0.2 --quiet
The sampler takes the interpreter lock to read the stack, so a sample that waited long for it marks a call that
held the lock (its line is the one after that call); the wait is reported too.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, ".")

from engine.models.llama import LlamaForCausalLM  # noqa: E402
from engine.piecewise_graph import MixedGraphs  # noqa: E402
from engine.runner import ModelRunner  # noqa: E402
from engine.sampler import Sampler  # noqa: E402
from kernels.attention.flashinfer_backend import FlashInferBackend  # noqa: E402


@dataclass
class Launch:
    start: float
    end: float = 0.0
    phases: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))
    samples: list[tuple[str, float]] = field(default_factory=list)  # (innermost project line, lock wait ms)
    tokens: int = 0
    decode_rows: int = 0
    # whether the step launched before this one had finished on the GPU when this launch began / ended: a launch that
    # starts with it running and ends with it done may have waited for it
    prev_done_at_start: bool = False
    prev_done_at_end: bool = False
    logits_rows_first_seen: bool = False  # this launch's LM-head GEMM ran at a row count not seen before


class Recorder:
    def __init__(self, interval: float):
        self.interval = interval
        self.launches: list[Launch] = []
        self.current: Launch | None = None
        self.tid: int | None = None
        self.stop = False
        self.prev_ready: Any = None  # the previous launch's StepOutput.ready (a CUDA event)
        self.logits_rows: set[int] = set()

    def phase(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.current is not None and threading.get_ident() == self.tid:
                    self.current.phases[name] += time.perf_counter() - t

        return timed

    def logits(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def logits(model: Any, h: Any) -> Any:
            if self.current is not None and h.shape[0] not in self.logits_rows:
                self.logits_rows.add(h.shape[0])
                self.current.logits_rows_first_seen = True
            return fn(model, h)

        return logits

    def launch(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(runner: ModelRunner, batch: Any) -> Any:
            self.tid = threading.get_ident()
            prev = self.prev_ready
            cur = Launch(time.perf_counter(), tokens=batch.num_tokens, decode_rows=batch.num_decode)
            cur.prev_done_at_start = prev is None or prev.query()
            self.current = cur
            try:
                out = fn(runner, batch)
                self.prev_ready = out.ready
                return out
            finally:
                cur.end = time.perf_counter()
                cur.prev_done_at_end = prev is None or prev.query()
                self.launches.append(cur)
                self.current = None

        return run

    def sample_forever(self) -> None:
        while not self.stop:
            t = time.perf_counter()
            frames = sys._current_frames()  # needs the interpreter lock: returns once the engine thread lets go
            waited = 1e3 * (time.perf_counter() - t)
            cur = self.current
            if cur is not None and self.tid in frames:
                cur.samples.append((self._where(frames[self.tid]), waited))
            time.sleep(self.interval)

    @staticmethod
    def _where(frame: Any) -> str:
        """The innermost frame in this project's code, with the library frames below it named."""
        inner: list[str] = []
        while frame is not None:
            name = frame.f_code.co_filename
            parts = name.split("/")
            library = "/site-packages/" in name or "/lib/python" in name or "slow_launches" in name
            if len(parts) >= 2 and not library:
                loc = f"{parts[-2]}/{parts[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
                return loc + (f" > {inner[-1]}" if inner else "")
            if not inner:
                inner.append(f"{parts[-1]}:{frame.f_lineno} {frame.f_code.co_name}")
            frame = frame.f_back
        return inner[0] if inner else "?"


def summarize(launches: list[Launch], title: str, top: int) -> dict[str, Any]:
    if not launches:
        print(f"{title}: none")
        return {}
    wall = [1e3 * (x.end - x.start) for x in launches]
    phases: dict[str, list[float]] = collections.defaultdict(list)
    for x in launches:
        for k, v in x.phases.items():
            phases[k].append(1e3 * v)
    lines: collections.Counter[str] = collections.Counter()
    waits: collections.Counter[str] = collections.Counter()
    n_samples = 0
    for x in launches:
        for where, waited in x.samples:
            lines[where] += 1
            n_samples += 1
            if waited > 2.0:
                waits[where] += 1
    first_m = sum(x.logits_rows_first_seen for x in launches)
    spanned = sum(not x.prev_done_at_start and x.prev_done_at_end for x in launches)
    print(
        f"{title}: {len(launches)} launches, wall p50 {statistics.median(wall):.1f} ms,"
        f" mean {statistics.mean(wall):.1f} ms; tokens p50 {statistics.median(x.tokens for x in launches):.0f},"
        f" decode rows p50 {statistics.median(x.decode_rows for x in launches):.0f};"
        f" the previous step finished on the GPU during {spanned} of them"
        f" ({sum(x.prev_done_at_start for x in launches)} began with it already done); {first_m}"
        " ran the LM head at a new row count"
    )
    for k, times in sorted(phases.items(), key=lambda kv: -sum(kv[1])):
        print(f"  phase {k:22} mean {sum(times) / len(launches):7.2f} ms/launch  max {max(times):7.2f} ms")
    print(f"  {n_samples} samples; lines (share of samples, samples after a lock wait > 2 ms):")
    for where, c in lines.most_common(top):
        print(f"    {100 * c / n_samples:5.1f}%  {waits[where]:4d}  {where}")
    return {
        "launches": len(launches),
        "wall_ms_p50": statistics.median(wall),
        "prev_step_finished_during": spanned,
        "logits_rows_first_seen": first_m,
        "phases_ms_mean": {k: sum(v) / len(launches) for k, v in phases.items()},
        "lines": lines.most_common(top),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slow-ms", type=float, default=20.0)
    ap.add_argument("--interval-ms", type=float, default=0.5)
    ap.add_argument("--switch-interval-ms", type=float, default=0.5, help="sys.setswitchinterval while sampling")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default=None)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then a minisgl command line")
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command

    rec = Recorder(args.interval_ms / 1e3)
    ModelRunner.run = rec.launch(ModelRunner.run)  # type: ignore[method-assign]
    LlamaForCausalLM.logits = rec.logits(LlamaForCausalLM.logits)  # type: ignore[method-assign]
    for cls, names in (
        (ModelRunner, ("prepare", "_output", "_prompt_logprobs")),
        (LlamaForCausalLM, ("logits",)),
        (FlashInferBackend, ("plan", "plan_graph", "forward")),
        (MixedGraphs, ("run",)),
        (Sampler, ("sample", "start")),
    ):
        for name in names:
            setattr(cls, name, rec.phase(f"{cls.__name__}.{name}", getattr(cls, name)))
    sys.setswitchinterval(args.switch_interval_ms / 1e3)
    sampler = threading.Thread(target=rec.sample_forever, daemon=True)
    sampler.start()
    from minisgl_cli.app import main as cli

    sys.argv = ["minisgl", *cmd]
    try:
        cli()
    except SystemExit:
        pass
    finally:
        rec.stop = True
    launches = rec.launches[20:]  # the first steps build kernels
    slow = [x for x in launches if 1e3 * (x.end - x.start) > args.slow_ms]
    typical = [x for x in launches if 1e3 * (x.end - x.start) <= args.slow_ms]
    out = {
        "slow": summarize(slow, f"launches over {args.slow_ms:g} ms", args.top),
        "typical": summarize(typical, "the other launches", args.top),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
