"""Tensor-parallel logits check on the GPU: run once plainly (TP=1) and once under torchrun (TP=N) with the same
dummy weights, then compare.

    python benchmarks/tp_check.py dump tp1.pt
    torchrun --nproc-per-node 2 benchmarks/tp_check.py dump tp2.pt
    python benchmarks/tp_check.py compare tp1.pt tp2.pt

MINISGL_TP_MODEL picks the model (default dummy:Qwen3-0.6B), MINISGL_TP_KV_DTYPE the KV cache's dtype (fp8: the
Triton fp8 decode over each rank's share of the KV heads).
"""

from __future__ import annotations

import json
import os
import sys

import torch

MODEL = os.environ.get("MINISGL_TP_MODEL", "dummy:Qwen3-0.6B")
KV_DTYPE = os.environ.get("MINISGL_TP_KV_DTYPE", "auto")


def dump(path: str) -> None:
    from engine.config import EngineConfig
    from engine.distributed import TP
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams
    from engine.tp_follower import run_tp_follower

    tp = int(os.environ.get("WORLD_SIZE", "1"))
    llm = LLM(EngineConfig(model=MODEL, tp=tp, kv_cache_gb=8, cuda_graph_max_bs=0, kv_cache_dtype=KV_DTYPE))
    if TP.rank != 0:
        run_tp_follower(llm)
        return
    log: list[torch.Tensor] = []
    orig = llm.engine.loaded.model.logits

    def logits(h: torch.Tensor) -> torch.Tensor:
        log.append(orig(h).float().cpu())
        return log[-1].to(h.device)

    llm.engine.loaded.model.logits = logits  # type: ignore[method-assign]  # record each step's logits
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 10000, (n,), generator=g).tolist() for n in (16, 200, 700, 1500)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    llm.shutdown()
    torch.save({"logits": log, "tokens": [o.token_ids for o in outs]}, path)


def compare(a_path: str, b_path: str) -> None:
    """Step by step, row by row (one row per request, in the batch's order). Dummy weights give near-flat logits, so a
    greedy token can flip between two correct runs where its top two logits nearly tie; from the step after a flip,
    that request's rows are of different inputs, so the error is measured only up to a row's first flip, and each
    flip is reported with its top-two margin in both runs (a tie shows as a margin within the error)."""
    a, b = torch.load(a_path), torch.load(b_path)
    prefill = [
        float((x - y).norm(dim=-1).max() / y.norm(dim=-1).min()) for x, y in zip(a["logits"][:1], b["logits"][:1])
    ]
    flipped: set[int] = set()
    errs: list[float] = []
    flips: list[dict] = []
    for step, (x, y) in enumerate(zip(a["logits"], b["logits"])):
        for row in range(len(x)):
            if row in flipped:
                continue
            errs.append(float((x[row] - y[row]).norm() / y[row].norm()))
            ta, tb = int(x[row].argmax()), int(y[row].argmax())
            if ta != tb:
                flipped.add(row)
                top_a, top_b = x[row].topk(2).values, y[row].topk(2).values
                flips.append(
                    {
                        "step": step,
                        "row": row,
                        "tokens": [ta, tb],
                        "top2_margin": [float(top_a[0] - top_a[1]), float(top_b[0] - top_b[1])],
                        "max_abs_logit_diff": float((x[row] - y[row]).abs().max()),
                    }
                )
    print(
        json.dumps(
            {
                "model": MODEL,
                "kv_cache_dtype": KV_DTYPE,
                "prefill_rel_err_max": max(prefill),
                "steps_rel_err_max_until_a_flip": max(errs),
                "greedy_tokens_equal": a["tokens"] == b["tokens"],
                "flips": flips,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    dump(sys.argv[2]) if sys.argv[1] == "dump" else compare(sys.argv[2], sys.argv[3])
