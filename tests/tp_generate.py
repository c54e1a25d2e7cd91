"""Run under torchrun: generate with tensor parallelism and write rank 0's tokens to a JSON file.

python -m torch.distributed.run --nproc-per-node N tests/tp_generate.py MODEL OUT.json
"""

from __future__ import annotations

import json
import sys

from engine.config import EngineConfig
from engine.distributed import TP
from engine.llm import LLM
from engine.tp_follower import run_tp_follower
from tests.tp_cases import ENGINE, PARAMS, prompts


def main() -> None:
    model, out = sys.argv[1], sys.argv[2]
    tp = int(__import__("os").environ["WORLD_SIZE"])
    llm = LLM(EngineConfig(model=model, tp=tp, **ENGINE))
    if TP.rank != 0:
        run_tp_follower(llm)
        return
    results = {name: [o.token_ids for o in llm.generate(prompts(model), p)] for name, p in PARAMS.items()}
    llm.shutdown()
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
