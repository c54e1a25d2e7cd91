"""Run under torchrun: generate with tensor parallelism and write rank 0's tokens to a JSON file.

python -m torch.distributed.run --nproc-per-node N tests/tp_generate.py MODEL OUT.json [KV_CACHE_DTYPE]
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys

from engine.config import EngineConfig
from engine.distributed import TP
from engine.llm import LLM
from engine.tp_follower import run_tp_follower
from tests.tp_cases import ENGINE, PARAMS, prompts


def watch_collections(llm: LLM) -> dict[str, list]:
    """What the collector was set to on this rank while it followed: the oldest generation's threshold and the
    frozen object count at each step, and whether the engine had work at each full collection."""
    seen: dict[str, list] = {"steps": [], "full_with_work": []}
    step = llm.engine.step

    def watched_step() -> list:
        seen["steps"].append([gc.get_threshold()[2], gc.get_freeze_count()])
        return step()

    def watch(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            seen["full_with_work"].append(llm.engine.has_work())

    llm.engine.step = watched_step  # type: ignore[method-assign]
    gc.callbacks.append(watch)
    return seen


def ctrl_c_mid_step(llm: LLM, model: str) -> bool:
    """Ctrl-C on rank 0 while a step runs its model (between collectives): generate() must end with
    KeyboardInterrupt and leave every rank in step with the others (it used to hang them all)."""
    runner = llm.engine.runner
    run = runner.run

    def interrupted_run(*args, **kwargs):
        runner.run = run
        os.kill(os.getpid(), signal.SIGINT)
        return run(*args, **kwargs)

    runner.run = interrupted_run  # type: ignore[method-assign]
    try:
        llm.generate(prompts(model), PARAMS["greedy"])
    except KeyboardInterrupt:
        return True
    return False


def main() -> None:
    model, out = sys.argv[1], sys.argv[2]
    kv_cache_dtype = sys.argv[3] if len(sys.argv) > 3 else "auto"
    tp = int(os.environ["WORLD_SIZE"])
    llm = LLM(EngineConfig(model=model, tp=tp, kv_cache_dtype=kv_cache_dtype, **ENGINE))
    if TP.rank != 0:
        seen = watch_collections(llm)
        run_tp_follower(llm)
        with open(f"{out}.rank{TP.rank}", "w") as f:
            json.dump(seen, f)
        return
    results: dict[str, object] = {
        name: [o.token_ids for o in llm.generate(prompts(model), p)] for name, p in PARAMS.items()
    }
    if "tiny" in model:  # a second of the tiny model's time; SmolLM2 at TP=3 on CI's CPUs would take far longer
        results["interrupted"] = ctrl_c_mid_step(llm, model)
        results["after_ctrl_c"] = [o.token_ids for o in llm.generate(prompts(model), PARAMS["greedy"])]
    llm.shutdown()
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
