"""Run under torchrun (2 processes): the Python API's rules at TP=2, each rank writing what it saw to OUT.rankN.json.

python -m torch.distributed.run --nproc-per-node 2 tests/tp_api.py OUT

- a rank > 0 takes no requests (its own would have run with rank 0's rid on rank 0's batch);
- a second engine after the first one's shutdown joins a group of its own (it read the first group's stale
  rendezvous addresses: a gloo "Connection refused", or a hang for MINISGL_DIST_TIMEOUT);
- ranks started with different settings are refused on every rank, naming them, and leave the group (a later engine
  starts).
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed

from engine.config import EngineConfig
from engine.distributed import TP
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.tp_follower import run_tp_follower

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def config(page_size: int = 4) -> EngineConfig:
    return EngineConfig(model="dummy:tiny-llama", device="cpu", tp=2, page_size=page_size, num_pages=256)


def engine_round(seen: dict[str, object], key: str) -> None:
    llm = LLM(config())
    if TP.rank != 0:
        try:
            llm.add_request([1, 2, 3], GREEDY)
        except RuntimeError as e:
            seen["refused"] = str(e)
        run_tp_follower(llm)
        return
    seen[key] = [o.token_ids for o in llm.generate([[1, 2, 3], [4, 5, 6, 7]], GREEDY)]
    llm.shutdown()


def main() -> None:
    out = sys.argv[1]
    seen: dict[str, object] = {}
    engine_round(seen, "first")
    engine_round(seen, "second")
    rank = int(os.environ["RANK"])
    try:
        LLM(config(page_size=4 if rank == 0 else 8))
    except ValueError as e:
        seen["different"] = str(e)
    # the refused start left the group on every rank (a group kept to interpreter exit could abort the rank there)
    seen["left"] = not torch.distributed.is_initialized() and TP.cpu_group is None
    engine_round(seen, "third")  # and a later engine starts
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
