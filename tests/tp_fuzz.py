"""Run under torchrun (2 processes): random workloads through a TP=2 engine, one step at a time.

python -m torch.distributed.run --nproc-per-node 2 tests/tp_fuzz.py PLAN.pickle OUT

PLAN (written by tests/test_tp.py) holds the model, engine settings, the workloads drawn for each and every request's
reference output (run alone at TP=1). For each setting every rank starts the engine once; rank 0 drives the workloads
through it (tests/fuzz_workloads.py's drive and checks: the promises of the one-process fuzz), the followers follow.
Every rank checks page accounting after every step (check_invariants) and writes a record of each step (page counts
and a digest of the scheduler's state) to OUT.rankN.json, with rank 0's workload boundaries, for the test to compare
across ranks. Rank 0 writes the case it is on to OUT.case before each workload and, if a check fails, the traceback
to OUT.failure.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import sys
import traceback
import zlib
from dataclasses import dataclass
from typing import Any

from engine.distributed import TP
from engine.engine import Engine
from engine.llm import RequestOutput
from engine.request import Req
from engine.tp_follower import run_tp_follower
from tests.conftest import make_llm
from tests.fuzz_workloads import (
    MAX_TOKENS,
    VOCAB,
    Arrival,
    MemoKey,
    Reference,
    Setting,
    check_drained,
    check_outputs,
    drive,
)

Workload = tuple[list[Arrival], Arrival | None]  # the requests, and one that can never fit (or none)

# Each engine is started once and runs many workloads (a TP=2 step costs ~15 ms of gloo round trips on a 2-core CPU,
# ~30x a TP=1 step); pages the radix cache kept from earlier workloads are hit and evicted by later ones. "tight": a
# pool of about one large request (40 tokens, 6 pages of 16, 64 tokens): waiting, eviction and preemption. "chunks of
# N": mixed batches with an N-token step budget (chunked prefill); "prefill first": no mixed batches.
SETTINGS: dict[str, Setting] = {
    # page_size, num_pages, max_batch_tokens, radix_cache, overlap, max_running_requests, mixed_batch,
    # max_running_tokens, mixed_prefill_tokens
    "page 1, tight, chunks of 5, radix, 3 running": Setting(1, 40, 5, True, False, 3, True, None, 3),
    "page 16, tight, chunks of 16, radix, overlap": Setting(16, 6, 16, True, True, 64, True, None, 1024),
    "page 16, roomy, prefill first, no radix": Setting(16, 256, 8192, False, False, 64, False, None, 1024),
    "page 1, roomy, chunks of 37, no radix, overlap, 2 running": Setting(1, 4096, 37, False, True, 2, True, None, 1024),
    "page 1, tight, prefill first, radix, overlap, 120 tokens running": Setting(
        1, 64, 64, True, True, 64, False, 120, 1024
    ),
}


@dataclass
class Plan:
    model: str
    seed: int
    engines: list[tuple[str, Setting, list[Workload]]]
    memo: dict[MemoKey, RequestOutput]  # the references: Reference.memo, computed at TP=1


def draw_workloads(rng: random.Random, setting: Setting, n: int) -> list[Workload]:
    """`n` workloads for one engine: requests arriving at random steps, on one of two prefixes shared by the whole
    engine's run or none, exact twins of earlier requests (of this workload: published twice at once; of an earlier
    one: a hit on pages the cache kept), aborts at random steps (also after the request finished), stop tokens and
    strings, now and then a request that can never fit the pool. Each request alone fits the pool."""
    capacity = setting.num_pages * setting.page_size

    def tokens(k: int) -> tuple[int, ...]:
        return tuple(rng.randrange(VOCAB) for _ in range(k))

    prefixes = [tokens(rng.randint(1, 48)) for _ in range(2)]
    earlier: list[tuple[int, ...]] = []
    out: list[Workload] = []
    for _ in range(n):
        last_arrival = rng.choice([0, 0, 3, 10, 30])
        arrivals: list[Arrival] = []
        for _ in range(rng.randint(1, 8)):
            max_tokens = rng.randint(1, MAX_TOKENS)
            if earlier and rng.random() < 0.25:
                prompt = rng.choice(earlier)
            else:
                prefix = rng.choice([*prefixes, ()])
                prompt = prefix + tokens(rng.randint(0 if prefix else 1, 40))
            prompt = prompt[: capacity - max_tokens]
            earlier.append(prompt)
            abort_after = rng.randint(0, 20) if rng.random() < 0.35 else None
            stop = (rng.choice(["token", "text"]), rng.randrange(MAX_TOKENS)) if rng.random() < 0.25 else None
            arrivals.append(Arrival(rng.randint(0, last_arrival), prompt, max_tokens, abort_after, stop))
        too_big = None
        if rng.random() < 0.25:
            too_big = Arrival(rng.randint(0, last_arrival), tokens(rng.randint(1, 8)), capacity, None)
        out.append((arrivals, too_big))
    return out


def step_record(engine: Engine, changed: list[Req]) -> list[int]:
    """What must be equal on every rank after a step: page counts (free, evictable, in use), live and known requests,
    and a digest of each queue's requests with their pages, lengths and tokens so far and of the requests the step
    ended with their reasons."""
    c, s = engine.cache, engine.scheduler
    state = (
        [r.rid for r in s.waiting],
        [(r.rid, r.status.name, r.slot, r.pages, r.cached_len, r.device_len, len(r.output_ids)) for r in s.live],
        [r.rid for r in s.running],
        [(r.rid, r.finish_reason, len(r.output_ids)) for r in changed if r.finished],
    )
    digest = zlib.crc32(repr(state).encode())
    return [c.num_free, c.num_evictable, c.num_in_use, len(s.live), len(engine.reqs), digest]


def record_steps(engine: Engine, records: list[list[int]]) -> None:
    step = engine.step

    def recorded() -> list[Req]:
        changed = step()
        records.append(step_record(engine, changed))
        return changed

    engine.step = recorded  # type: ignore[method-assign]


def main() -> None:
    plan_path, out = sys.argv[1], sys.argv[2]
    with open(plan_path, "rb") as f:
        plan: Plan = pickle.load(f)
    reference = Reference(None, plan.memo)
    seen: dict[str, Any] = {"steps": [], "boundaries": [], "stats": []}
    for name, setting, workloads in plan.engines:
        llm = make_llm(plan.model, tp=2, **setting.engine_kwargs())
        record_steps(llm.engine, seen["steps"])
        if TP.rank != 0:
            run_tp_follower(llm)
            continue
        finished, before = 0, llm.metrics()
        for i, (arrivals, too_big) in enumerate(workloads):
            with open(f"{out}.case", "w") as f:
                json.dump(
                    {
                        "seed": plan.seed,
                        "engine": name,
                        "workload": i,
                        "arrivals": repr(arrivals),
                        "too_big": repr(too_big),
                    },
                    f,
                )
            try:
                run = drive(llm, arrivals, too_big, reference)
                check_outputs(run, arrivals, reference, setting)
                finished += len(arrivals)
                check_drained(llm, setting, finished)
            except BaseException:
                with open(f"{out}.failure", "w") as f:
                    f.write(traceback.format_exc())
                sys.stderr.flush()
                os._exit(1)  # at once: the followers' next collective fails and they leave too (no shutdown to wait on)
            seen["boundaries"].append(len(seen["steps"]))
            m = llm.metrics()
            seen["stats"].append(  # what this workload made happen
                {
                    "preempted": m.preemptions - before.preemptions,
                    "radix hit": m.cache_hit_tokens - before.cache_hit_tokens,
                    "mixed step": m.mixed_steps - before.mixed_steps,
                    "aborted": len(run.aborted),
                    "stopped": sum(outs[-1].finish_reason == "stop" for outs in run.outputs.values()),
                    "refused one": too_big is not None,
                }
            )
            before = m
        llm.shutdown()
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
