"""Per-layer prefill attention at bench-offline's chunk, FlashInfer's kernel choices side by side (GPU only; issue #17).

The prefill steps take ~0.4 s of the offline workload (not in the floor), and FlashInfer's fa2 paged prefill is a
quarter of each 8192-token chunk's kernel time at ~130 TFLOP/s (docs/gpu.md). Variants, each on the same chunk
(Qwen3-0.6B attention: 16 q heads, 8 kv heads, head_dim 128, bf16; prompts drawn like the workload's, lengths
uniform in [100, 1024], page size 16):
- paged fa2 (what ran before e4e7b3f) and paged fa3: K/V read from the pool through the page table;
- ragged fa2 and ragged fa3: K/V read from contiguous [T, KVH, D] tensors, as the projection produces them (valid
  only for requests without KV from before the step).
Median of 20 CUDA-event timed calls after one untimed call (its JIT build); each output is checked against paged
fa2. Then the engine's backend (kernels/attention/flashinfer_backend.py) on whole batches as the scheduler builds
them, one paged pass (RAGGED_PREFILL off) against the two-part prefill (the trailing fresh prompts ragged, the rest
paged; with fa3 or fa2 for the ragged part), K/V passed as the strided views of a qkv projection output the fused
kernel leaves them in: fresh prompts only, mixed batches (decode rows first, a continuing chunk, fresh prompts),
prompts with a cached prefix (no fresh tail: one paged pass either way), and prefixed requests between fresh ones.
Plan time on the host is reported too.
Usage there: python benchmarks/prefill_attention_kernels.py OUT.json
"""

from __future__ import annotations

import json
import random
import sys
from functools import partial

import torch
from attention_batches import backend_timing, paged_batch, timed

from kernels.attention import flashinfer_backend as fib

H, KVH, D, CHUNK, PS = 16, 8, 128, 8192, 16
dev = torch.device("cuda")


def prompt_lens(seed: int = 0) -> list[int]:
    rng, lens, left = random.Random(seed), [], CHUNK
    while left > 0:
        n = min(rng.randint(100, 1024), left)
        lens.append(n)
        left -= n
    return lens


def batch_layouts() -> dict[str, list[tuple[int, int]]]:
    """(q_len, kv_len) per request, decode rows first as the scheduler orders them."""
    rng = random.Random(1)

    def fill(reqs: list[tuple[int, int]], prefix: int = 0) -> list[tuple[int, int]]:
        left = CHUNK - sum(q for q, _ in reqs)
        while left > 0:
            n = min(rng.randint(100, 1024), left)
            reqs.append((n, n + prefix))
            left -= n
        return reqs

    decode = [(1, rng.randint(300, 1500)) for _ in range(240)]
    scattered = fill([])
    scattered = [(q, kv + (512 if i % 2 else 0)) for i, (q, kv) in enumerate(scattered)]
    return {
        "fresh": fill([]),
        "mixed 128 decode": fill(decode[:128] + [(350, 750)]),
        "mixed 240 decode": fill(decode + [(350, 750)]),
        "prefix 512": fill([], prefix=512),
        "scattered prefix": scattered,
    }


def backend_rows() -> list[dict[str, object]]:
    out = []
    variants = {"paged fa2 (one pass)": (False, "fa2"), "two-part, ragged fa3": (True, "fa3")}
    variants["two-part, ragged fa2"] = (True, "fa2")
    fib.CHUNK_FA3_MIN_TOKENS = 10**9  # the paged pass on fa2 throughout, as when these variants were measured
    for name, reqs in batch_layouts().items():
        torch.manual_seed(0)
        pool, meta = paged_batch(reqs, KVH, D, PS, dev)
        q_lens, out_slots = meta.q_lens, meta.out_slots
        T = sum(q_lens)
        qkv = torch.empty(T, (H + 2 * KVH) * D, dtype=torch.bfloat16, device=dev)
        q, k, v = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
        q, k, v = q.view(T, H, D), k.view(T, KVH, D), v.view(T, KVH, D)
        q.normal_()
        k.copy_(pool.k[0].view(-1, KVH, D)[out_slots])
        v.copy_(pool.v[0].view(-1, KVH, D)[out_slots])
        row: dict[str, object] = {"layout": name, "requests": len(reqs), "tokens": T}
        ref = None
        for label, (ragged, kernels) in variants.items():
            fib.RAGGED_PREFILL, fib.RAGGED_KERNELS = ragged, kernels
            be = fib.FlashInferBackend(pool, H, KVH, D, dev)
            timing, o = backend_timing(be, meta, q, k, v)
            ref = o if ref is None else ref
            row[label] = {**timing, "rel_err": float((o - ref).norm() / ref.norm())}
        fib.RAGGED_PREFILL, fib.RAGGED_KERNELS = True, "fa3"
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    import flashinfer

    rows = []
    for name, lens in (("workload", prompt_lens()), ("one", [CHUNK])):
        torch.manual_seed(0)
        T = sum(lens)
        q = torch.randn(T, H, D, dtype=torch.bfloat16, device=dev)
        k = torch.randn(T, KVH, D, dtype=torch.bfloat16, device=dev)
        v = torch.randn(T, KVH, D, dtype=torch.bfloat16, device=dev)
        pages = [-(-n // PS) for n in lens]
        perm = (torch.randperm(sum(pages)) + 1).to(torch.int32)  # scattered pages, page 0 unused
        kp = torch.zeros(sum(pages) + 1, PS, KVH, D, dtype=torch.bfloat16, device=dev)
        vp = torch.zeros_like(kp)
        slots, at = [], 0
        for n, p in zip(lens, pages):
            pos = torch.arange(n)
            slots.append(perm[at : at + p][pos // PS].long() * PS + pos % PS)
            at += p
        flat = torch.cat(slots).to(dev)
        kp.view(-1, KVH, D)[flat] = k
        vp.view(-1, KVH, D)[flat] = v
        qo = torch.zeros(len(lens) + 1, dtype=torch.int32)
        qo[1:] = torch.tensor(lens).cumsum(0)
        page_indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
        page_indptr[1:] = torch.tensor(pages).cumsum(0)
        last = torch.tensor([(n - 1) % PS + 1 for n in lens], dtype=torch.int32)
        ws = torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev)
        common = dict(causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=D**-0.5)
        outs: dict[str, torch.Tensor] = {}
        row: dict[str, object] = {"layout": name, "requests": len(lens), "tokens": T}
        flops = sum(2 * n * n * D * H for n in lens)  # causal: half of 4 * n^2 * D per head
        for kind in ("paged", "ragged"):
            for backend in ("fa2", "fa3"):
                label = f"{kind}_{backend}"
                try:
                    if kind == "paged":
                        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
                        w.plan(qo, page_indptr, perm.to(dev), last, H, KVH, D, PS, **common)
                        fn = partial(w.run, q, (kp, vp))
                    else:
                        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
                        w.plan(qo.to(dev), qo.to(dev), H, KVH, D, **common)
                        fn = partial(w.run, q, k, v)
                    us = timed(fn)
                    outs[label] = fn().float()
                    row[label] = {"us": us, "tflops": flops / us / 1e6}
                except Exception as err:  # record what failed, keep the other variants
                    row[label] = {"error": repr(err)[:1500]}
        ref = outs.get("paged_fa2")
        for label, o in outs.items():
            if ref is not None:
                entry = row[label]
                assert isinstance(entry, dict)
                entry["rel_err_vs_paged_fa2"] = float((o - ref).norm() / ref.norm())
        rows.append(row)
        print(json.dumps(row), flush=True)
    brows = backend_rows()
    json.dump(
        {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "flashinfer": flashinfer.__version__,
            "rows": rows,
            "backend_rows": brows,
        },
        open(sys.argv[1], "w"),
        indent=1,
    )
    for r in rows:
        print(f"{r['layout']} ({r['requests']} requests):")
        for label in ("paged_fa2", "paged_fa3", "ragged_fa2", "ragged_fa3"):
            e = r[label]
            assert isinstance(e, dict)
            if "us" in e:
                print(
                    f"  {label:<11} {e['us']:8.1f} us {e['tflops']:6.0f} TFLOP/s"
                    f"  rel err {e.get('rel_err_vs_paged_fa2', 0):.1e}"
                )
            else:
                print(f"  {label:<11} failed: {str(e['error'])[:200]}")
    for r in brows:
        print(f"{r['layout']} ({r['requests']} requests, {r['tokens']} tokens):")
        for label, e in r.items():
            if isinstance(e, dict):
                print(f"  {label:<22} {e['us']:8.1f} us  plan {e['plan_ms']:5.2f} ms  rel err {e['rel_err']:.1e}")


if __name__ == "__main__":
    main()
