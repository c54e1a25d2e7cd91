"""Run under torchrun (2 processes): the engine start fails on one rank only (its model load raises, injected here).

python -m torch.distributed.run --nproc-per-node 2 tests/tp_start_fail.py FAIL_RANK OUT api
python -m torch.distributed.run --nproc-per-node 2 tests/tp_start_fail.py FAIL_RANK OUT minisgl_cli-arguments...

Each rank writes its pid to OUT.rankN.pid. `api`: each rank builds an LLM and catches the error, as a script that goes
on after it would (the failing rank, alive and in its group, held the other one in the start's all-reduce for
MINISGL_DIST_TIMEOUT), then builds a second one, which rank 0 generates with; each writes what it saw to
OUT.rankN.json. Otherwise: runs the CLI (the failing rank's load fails, the others' start goes on).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

import engine.engine
from engine.config import EngineConfig
from engine.llm import LLM
from engine.loader import load_model
from engine.sampling_params import SamplingParams
from engine.tp_follower import run_tp_follower

RANK = int(os.environ["RANK"])
CAUSE = "cannot read model.safetensors: Permission denied (injected)"


def fail_load_on(rank: int) -> None:
    """The engine's first model load on `rank` raises; a later one (of a second engine) loads."""

    def failing_load(*args: Any, **kwargs: Any) -> Any:
        engine.engine.load_model = load_model  # type: ignore[attr-defined]
        if RANK == rank:
            raise OSError(CAUSE)
        return load_model(*args, **kwargs)

    engine.engine.load_model = failing_load  # type: ignore[attr-defined]


def api(out: str) -> None:
    config = EngineConfig(model="dummy:tiny-llama", device="cpu", tp=2, num_pages=64)
    t0 = time.monotonic()
    seen: dict[str, object] = {"error": None}
    try:
        LLM(config)
    except Exception as e:
        seen["error"] = f"{type(e).__name__}: {e}"
    seen |= {"seconds": time.monotonic() - t0, "left": not dist.is_initialized()}
    llm = LLM(config)  # and a later engine starts, in a group of its own
    if RANK == 0:
        greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        seen["second"] = list(llm.generate([[1, 2, 3]], greedy)[0].token_ids)
        llm.shutdown()
    else:
        run_tp_follower(llm)
    Path(f"{out}.rank{RANK}.json").write_text(json.dumps(seen))


def main() -> None:
    fail_rank, out, *rest = sys.argv[1:]
    Path(f"{out}.rank{RANK}.pid").write_text(str(os.getpid()))
    fail_load_on(int(fail_rank))
    if rest == ["api"]:
        api(out)
        return
    from minisgl_cli.app import main as cli

    sys.argv = ["minisgl", *rest]
    cli()


if __name__ == "__main__":
    main()
