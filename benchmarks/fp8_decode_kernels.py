"""Decode attention over a bf16 and an fp8 (e4m3) KV pool, FlashInfer's kernel choices side by side (GPU).

The saturated replay's decode step (issue #15): 256 rows, contexts of 1,200-5,800 tokens (mean ~3,500), page 16,
one layer. FlashInfer's tensor-core decode (its fa2 prefill template, what the engine runs) and its CUDA-core decode
kernel, each over bf16 and e4m3 K/V, with and without split-KV. Median of 20 CUDA-event timed calls; also the
achieved KV read rate and each output's error against the bf16 tensor-core result.
Usage there: python benchmarks/fp8_decode_kernels.py OUT.json [HEADS KV_HEADS]
"""

from __future__ import annotations

import json
import random
import sys
from functools import partial

import flashinfer
import torch
from attention_batches import timed

PS, D = 16, 128
dev = torch.device("cuda")


def main() -> None:
    out_path = sys.argv[1]
    H, KVH = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (16, 8)
    rng = random.Random(0)
    results = []
    for rows, lo, hi in ((256, 1200, 5800), (64, 1200, 5800), (256, 200, 1000)):
        kv_lens = [rng.randint(lo, hi) for _ in range(rows)]
        pages = [-(-n // PS) for n in kv_lens]
        total = sum(pages)
        perm = torch.randperm(total, device=dev).int()
        indptr = torch.zeros(rows + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor(pages).cumsum(0)
        last = torch.tensor([(n - 1) % PS + 1 for n in kv_lens], dtype=torch.int32)
        k16 = torch.randn(total, PS, KVH, D, device=dev, dtype=torch.bfloat16)
        v16 = torch.randn(total, PS, KVH, D, device=dev, dtype=torch.bfloat16)
        caches = {"bf16": (k16, v16), "e4m3": (k16.to(torch.float8_e4m3fn), v16.to(torch.float8_e4m3fn))}
        q = torch.randn(rows, H, D, device=dev, dtype=torch.bfloat16)
        ws = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)
        ref = None
        for kv_name, cache in caches.items():
            for tc in (True, False):
                for split in (True, False):
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc, backend="fa2")
                    try:
                        w.plan(
                            indptr,
                            perm,
                            last,
                            H,
                            KVH,
                            D,
                            PS,
                            q_data_type=torch.bfloat16,
                            kv_data_type=cache[0].dtype,
                            disable_split_kv=not split,
                        )
                        us = timed(partial(w.run, q, cache))
                        o = w.run(q, cache).float()
                    except Exception as e:  # a combination FlashInfer does not build
                        results.append(dict(rows=rows, kv=kv_name, tensor_cores=tc, split=split, error=str(e)[:200]))
                        print(rows, kv_name, tc, split, "error", str(e)[:120], flush=True)
                        continue
                    ref = o if ref is None else ref
                    err = float((o - ref).norm() / ref.norm())
                    nbytes = sum(kv_lens) * KVH * D * 2 * cache[0].element_size()
                    r = dict(
                        rows=rows,
                        ctx=f"{lo}-{hi}",
                        kv=kv_name,
                        tensor_cores=tc,
                        split=split,
                        us=round(us, 1),
                        tb_per_s=round(nbytes / us / 1e6, 2),
                        rel_err=err,
                    )
                    results.append(r)
                    print(json.dumps(r), flush=True)
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
