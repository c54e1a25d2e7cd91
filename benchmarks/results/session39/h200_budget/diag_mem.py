"""Session 39 diagnostics (not committed): what holds CUDA memory after an LLM is dropped."""

import gc

import torch


def report(tag: str) -> None:
    free, total = torch.cuda.mem_get_info()
    print(
        f"[{tag}] alloc {torch.cuda.memory_allocated() / 2**30:.2f} GiB reserved "
        f"{torch.cuda.memory_reserved() / 2**30:.2f} GiB free {free / 2**30:.2f} of {total / 2**30:.2f}",
        flush=True,
    )
    big = [
        o
        for o in gc.get_objects()
        if isinstance(o, torch.Tensor) and o.is_cuda and o.untyped_storage().nbytes() > 256 << 20
    ]
    print(
        f"[{tag}] {len(big)} live CUDA tensors over 256 MiB, "
        f"{sum(t.untyped_storage().nbytes() for t in big) / 2**30:.2f} GiB",
        flush=True,
    )
    for t in big[:3]:
        for r in gc.get_referrers(t):
            if r is big:
                continue
            desc = type(r).__name__
            if isinstance(r, list):
                outer = [type(x).__name__ for x in gc.get_referrers(r) if x is not big][:5]
                desc += f" (len {len(r)}) held by {outer}"
            elif isinstance(r, dict):
                outer = [type(x).__name__ for x in gc.get_referrers(r)][:5]
                desc += f" keys {list(r)[:6]} held by {outer}"
            print(f"[{tag}]   {tuple(t.shape)} <- {desc}", flush=True)
    from engine.llm import LLM
    from engine.runner import ModelRunner

    for cls in (LLM, ModelRunner):
        alive = [o for o in gc.get_objects() if isinstance(o, cls)]
        print(f"[{tag}] live {cls.__name__}: {len(alive)}", flush=True)
        for o in alive[:2]:
            print(f"[{tag}]   referrers: {[type(r).__name__ for r in gc.get_referrers(o)][:8]}", flush=True)
