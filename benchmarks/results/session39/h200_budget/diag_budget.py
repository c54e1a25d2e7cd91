"""Session 39 (not committed): an engine dropped in a cycle, collected at the start of the next one's load."""

import gc

import torch

import engine.engine as E
from engine.config import EngineConfig
from engine.llm import LLM

orig = E.load_model  # type: ignore[attr-defined]


def wrapped(*a, **k):
    gc.collect()  # as an automatic collection early in the load would
    return orig(*a, **k)


E.load_model = wrapped  # type: ignore[attr-defined]
cfg = EngineConfig(model="dummy:SmolLM2-135M", dtype="bfloat16", memory_fraction=0.5, max_running_requests=16)
old = LLM(cfg)
pages = old.metrics().kv_pages_total
setattr(old, "cycle", old)  # noqa: B010
del old
new = LLM(cfg)
print(
    f"pages old {pages} new {new.metrics().kv_pages_total}; reserved {torch.cuda.memory_reserved() / 2**30:.2f} "
    f"GiB allocated {torch.cuda.memory_allocated() / 2**30:.2f} GiB",
    flush=True,
)
new.shutdown()
