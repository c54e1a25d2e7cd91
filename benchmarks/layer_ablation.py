"""What would removing a decode layer's small kernels buy? An upper bound, before building any fusion (issue #17; GPU
only):

    source .whl/use-bundle.sh && python benchmarks/layer_ablation.py --out $OUT/layer_ablation.json

A decode step of Qwen3-0.6B's shapes, 28 layers with their own weights and paged KV (offline lengths, pages
scattered), one CUDA graph, timed per step with the modes interleaved:
- `base`: the engine's layer: RMSNorm(x + residual), qkv, the fused q/k norm + rope + KV store, FlashInfer's
  tensor-core decode, o, RMSNorm(x + residual), gate_up, SiLU * up, down;
- `no-norms`: both RMSNorm launches gone, the residual added by cuBLAS (`addmm`, beta 1) in the o and down GEMMs.
  This is where folding each norm's weight into the next GEMM's weight and its 1/rms into the kernel after that GEMM
  would lead: that fusion cannot be faster than this;
- `no-silu`: the SiLU launch gone (down reads the gate half as is): the bound for fusing it anywhere;
- `no-both`: both.
The modes compute different things on purpose; only their times mean anything.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from layer_chain import (  # this script's folder is on sys.path
    EPS,
    HIDDEN,
    INTER,
    LAYERS,
    DecodeBatch,
    Q,
    interleaved_step_ms,
    layer_weights,
)

from kernels import triton_ops

MODES = ("base", "no-norms", "no-silu", "no-both")


def run_batch(batch: int, weights: list[dict], dev: torch.device) -> dict:
    bf = torch.bfloat16
    db = DecodeBatch.draw(batch, torch.Generator().manual_seed(batch), dev)
    store, attn, kv, lens = db.rope_store(dev), db.wrapper(dev), db.kv, db.lens

    def step(mode: str, x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        norms, silu = mode in ("base", "no-silu"), mode in ("base", "no-norms")
        for i, w in enumerate(weights):
            if norms:
                h = triton_ops.rmsnorm(x, w["n1"], EPS, res)
            else:
                res = x  # the down GEMM below already added the residual
                h = x
            q = store(F.linear(h, w["qkv"]), i)
            o = attn.run(q, kv[i]).view(-1, Q)
            if norms:
                h = triton_ops.rmsnorm(F.linear(o, w["o"]), w["n2"], EPS, res)
            else:
                res = torch.addmm(res, o, w["o"].t())
                h = res
            gu = F.linear(h, w["gu"])
            act = triton_ops.silu_and_mul(gu) if silu else gu[:, :INTER]
            x = F.linear(act, w["down"]) if norms else torch.addmm(res, act, w["down"].t())
        return x

    x0 = torch.randn(batch, HIDDEN, device=dev, dtype=bf)
    r0 = torch.randn(batch, HIDDEN, device=dev, dtype=bf)
    ms, _ = interleaved_step_ms(step, MODES, x0, r0, rounds=11, skip=3)
    saved = {m: (ms["base"] - v) * 1e3 / LAYERS for m, v in ms.items()}
    row = dict(batch=batch, kv_tokens=int(lens.sum()), ms=ms, us_saved_per_layer=saved)
    print(
        f"batch {batch:4} ({int(lens.sum()):7} KV tokens): "
        + "  ".join(f"{m} {v:.3f} ms ({saved[m]:+.1f} us/layer)" for m, v in ms.items()),
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,64,128,256")
    ap.add_argument("--out", default="layer_ablation.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights = layer_weights(dev)
    rows = [run_batch(int(b), weights, dev) for b in args.batches.split(",")]
    with open(args.out, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
