"""Per-layer paged prefill attention, FlashAttention-4 vs FlashInfer fa2, at bench-offline's shapes (GPU only).

Qwen3-0.6B attention (16 q heads, 8 kv heads, head_dim 128, bf16); one 8192-token chunk, either split into prompts
drawn like the offline workload (lengths uniform in [100, 1024]) or one request, each with 0 or 512 cached tokens
before its new ones; page sizes 16, 64 and 128. The first call of each variant (its JIT compile) is timed apart;
then the median of 20 CUDA-event timed calls. Each backend's output is checked against the other.
Usage there: python benchmarks/fa_prefill_kernels.py OUT.json
"""

from __future__ import annotations

import json
import random
import sys
import time
from statistics import median

import torch
from attention_batches import paged_batch

from kernels.attention import flashinfer_backend
from kernels.attention.base import AttnMeta
from kernels.attention.fa_backend import FlashAttention4Backend
from kernels.attention.flashinfer_backend import FlashInferBackend
from kvcache.pool import KVPool

H, KVH, D, CHUNK = 16, 8, 128, 8192
dev = torch.device("cuda")


def layouts() -> dict[str, list[int]]:
    rng, lens, left = random.Random(0), [], CHUNK
    while left > 0:
        n = min(rng.randint(100, 1024), left)
        lens.append(n)
        left -= n
    return {"workload": lens, "one": [CHUNK]}


def batch(q_lens: list[int], prefix: int, ps: int) -> tuple[KVPool, AttnMeta]:
    return paged_batch([(n, prefix + n) for n in q_lens], KVH, D, ps, dev)


def time_backend(be: FlashAttention4Backend | FlashInferBackend, meta: AttnMeta, q: torch.Tensor) -> dict[str, float]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    be.plan(meta)
    be.forward(0, q, None, None)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        be.forward(0, q, None, None)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return {"first_call_s": first, "us": median(times)}


def main() -> None:
    flashinfer_backend.CHUNK_FA3_MIN_TOKENS = 10**9  # FlashInfer's paged pass on fa2, as the comparison is labelled
    rows = []
    for ps in (16, 64, 128):
        for prefix in (0, 512):
            for name, q_lens in layouts().items():
                torch.manual_seed(0)
                pool, meta = batch(q_lens, prefix, ps)
                q = torch.randn(CHUNK, H, D, dtype=torch.bfloat16, device=dev)
                fa, fi = FlashAttention4Backend(pool, H, KVH, D, dev), FlashInferBackend(pool, H, KVH, D, dev)
                row: dict[str, object] = {"page_size": ps, "prefix": prefix, "layout": name, "requests": len(q_lens)}
                try:
                    row["fa4"] = time_backend(fa, meta, q)
                    o_fa = fa.forward(0, q, None, None)
                except Exception as e:  # record the exact error: the issue is blocked on it
                    row["fa4_error"] = repr(e)[:2000]
                    o_fa = None
                row["fi_fa2"] = time_backend(fi, meta, q)
                if o_fa is not None:
                    o_fi = fi.forward(0, q, None, None).float()
                    row["rel_err"] = float((o_fa.float() - o_fi).norm() / o_fi.norm())
                rows.append(row)
                print(json.dumps(row), flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"))
    print(f"{'page':>4} {'prefix':>6} {'layout':>8} {'FA4 us':>8} {'fa2 us':>8} {'FA4 JIT s':>9} {'rel err':>8}")
    for r in rows:
        fa4, fi_t = r.get("fa4") or {}, r["fi_fa2"]
        assert isinstance(fa4, dict) and isinstance(fi_t, dict)
        print(
            f"{r['page_size']:>4} {r['prefix']:>6} {r['layout']:>8} "
            f"{fa4.get('us', float('nan')):8.1f} {fi_t['us']:8.1f} "
            f"{fa4.get('first_call_s', float('nan')):9.1f} {r.get('rel_err', float('nan')):8.1e}"
        )


if __name__ == "__main__":
    main()
