"""How much of the resident GEMM's gain under PDL survives in a whole decode layer? (issue #17; GPU only)

    source .whl/use-bundle.sh && python benchmarks/pdl_layer.py --out $OUT/pdl_layer.json

`resident_gemm.py` chains only GEMMs. In a decode layer each GEMM follows another kernel: RMSNorm (qkv, gate_up),
FlashInfer's decode (o), SiLU (down). A GEMM can load its weights before its wait only once the kernel before it
has let it launch. A decode step of Qwen3-0.6B's shapes (28 layers, their own weights, paged KV at offline
lengths; `layer_ablation.py`'s setup), one CUDA graph per mode, modes interleaved:
- `base`: the engine's layer (RMSNorm, qkv, fused q/k norm + rope + KV store, FlashInfer decode, o, RMSNorm,
  gate_up, SiLU, down; cuBLAS GEMMs);
- `gemm-pdl`: the four GEMMs replaced by `resident_gemm.cu`'s, launched with PDL; everything else as `base`;
- `all-pdl`: also RMSNorm and SiLU launched with PDL (each waits, then lets the next launch), so every GEMM can
  start loading its weights while the kernel before it runs. The fused rope kernel launches as before (it does not
  wait, so it must not start early); FlashInfer's decode launches with PDL as it always does (it waits at its
  start and lets the next kernel launch after its last writes).
Prints ms per step and the difference per layer, and each mode's largest difference from `base`'s output.
`--gemm clswap` (any of resident_gemm.py's `CUTLASS_CONFIGS`) runs `gemm-pdl` and `all-pdl` with that CUTLASS GEMM
instead of `resident_gemm.cu`'s (fifty-eighth session).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from layer_chain import (  # this script's folder is on sys.path
    EPS,
    HIDDEN,
    LAYERS,
    DecodeBatch,
    Q,
    interleaved_step_ms,
    layer_weights,
    rmsnorm_pdl,
    silu_pdl,
)
from resident_gemm import CUTLASS_CONFIGS, cuda_ext, cutlass_libs, cutlass_linear

from kernels import triton_ops

MODES = ["base", "gemm-pdl", "all-pdl"]


def run_batch(batch: int, weights: list[dict], dev: torch.device, ext, cutlass) -> dict:
    bf = torch.bfloat16
    db = DecodeBatch.draw(batch, torch.Generator().manual_seed(batch), dev)
    store, attn, kv, lens = db.rope_store(dev), db.wrapper(dev), db.kv, db.lens
    bm, stages = (16, 0) if batch <= 16 else (32, 3)  # resident_gemm.py's best at each size

    def step(mode: str, x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        small_pdl = mode == "all-pdl"

        def linear(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            if mode == "base":
                return F.linear(a, w)
            if cutlass is not None:
                return cutlass_linear(cutlass, a, w, True)
            return ext.resident_linear(a, w, True, bm, stages, False)

        def norm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return rmsnorm_pdl(a, w, res, True) if small_pdl else triton_ops.rmsnorm(a, w, EPS, res)

        for i, w in enumerate(weights):
            q = store(linear(norm(x, w["n1"]), w["qkv"]), i)
            o = attn.run(q, kv[i]).view(-1, Q)
            gu = linear(norm(linear(o, w["o"]), w["n2"]), w["gu"])
            act = silu_pdl(gu, True) if small_pdl else triton_ops.silu_and_mul(gu)
            x = linear(act, w["down"])
        return x

    x0 = torch.randn(batch, HIDDEN, device=dev, dtype=bf)
    r0 = torch.randn(batch, HIDDEN, device=dev, dtype=bf)
    ms, outs = interleaved_step_ms(step, MODES, x0, r0, rounds=11, skip=3)
    ref = outs["base"]
    err = {m: ((outs[m] - ref).abs().max() / ref.abs().max()).item() for m in MODES[1:]}
    saved = {m: (ms["base"] - v) * 1e3 / LAYERS for m, v in ms.items()}
    row = dict(batch=batch, kv_tokens=int(lens.sum()), ms=ms, us_saved_per_layer=saved, rel_err_vs_base=err)
    print(
        f"batch {batch:4} ({int(lens.sum()):7} KV tokens): "
        + "  ".join(f"{m} {v:.3f} ms ({saved[m]:+.1f} us/layer)" for m, v in ms.items())
        + f"  rel. err. {err}",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16,32,64")
    ap.add_argument("--gemm", default="cuda", choices=["cuda", *CUTLASS_CONFIGS], help="the GEMM the PDL modes run")
    ap.add_argument("--out", default="pdl_layer.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights = layer_weights(dev)
    ext = cuda_ext() if args.gemm == "cuda" else None
    cutlass = None if args.gemm == "cuda" else cutlass_libs([args.gemm])[args.gemm]
    rows = [run_batch(int(b), weights, dev, ext, cutlass) for b in args.batches.split(",")]
    with open(args.out, "w") as f:
        result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, gemm=args.gemm, rows=rows)
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
