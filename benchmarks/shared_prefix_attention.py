"""Decode attention over shared prefixes, two ways, on one layer (GPU; issue #15). Run on the GPU machine:

    source .whl/use-bundle.sh && python benchmarks/shared_prefix_attention.py --out $OUT/shared_prefix.json

The batch is the saturated replay's running set (bench-trace traces/qwen_1000.jsonl --time-scale 0.2): 256 decode
rows, about 880k tokens of context, three groups of requests on one cached system prompt each (110, 81 and 65 rows on
2,016, 1,984 and 368 tokens, the group sizes and prefix lengths of 256 consecutive requests of the trace), the rest of
each context its own. Qwen3-0.6B's shapes (16 query heads, 8 KV heads, head_dim 128, bf16, page 16).
  plain     FlashInfer's tensor-core decode over every row's whole page list (what the engine runs): a shared
            prefix is read once per row (or hits in L2)
  cascade   the prefill kernel over each group's prefix (its rows as the queries, read once per group), the decode
            kernel over each row's own pages, both with their log-sum-exp, merged (flashinfer.merge_state_in_place)
Timed over 30 calls after 5 warm-up calls; the outputs are compared.
"""

from __future__ import annotations

import argparse
import json

import torch
from decode_attention_kernels import SHARED_GROUPS, SharedBatch, time_us  # this script's folder is on sys.path

HEADS, KV_HEADS, DIM, PAGE = 16, 8, 128, 16


def main() -> None:
    import flashinfer

    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rows", type=int, default=256)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    dev = torch.device("cuda")
    rows = args.rows
    batch = SharedBatch.draw(rows, PAGE, g)
    full_tables, kv_lens, pool_pages = batch.tables(), batch.lens(PAGE), batch.pool_pages
    own_ids, own_lens, prefix_ids, group_of = batch.own_ids, batch.own_lens, batch.prefix_ids, batch.group_of
    k = torch.randn(pool_pages, PAGE, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16)
    v = torch.randn(pool_pages, PAGE, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16)
    q = torch.randn(rows, HEADS, DIM, device=dev, dtype=torch.bfloat16)
    ws = torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev)
    ws2 = torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev)

    def csr(tables: list[list[int]], lens: list[int]):
        indptr = torch.zeros(len(tables) + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor([len(t) for t in tables], dtype=torch.int32).cumsum(0)
        indices = torch.tensor([p for t in tables for p in t], dtype=torch.int32, device=dev)
        last = torch.tensor([(n - 1) % PAGE + 1 for n in lens], dtype=torch.int32)
        return indptr, indices, last

    common = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    plain = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    plain.plan(*csr(full_tables, kv_lens), HEADS, KV_HEADS, DIM, PAGE, **common)

    own = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws2, "NHD", use_tensor_cores=True)
    own.plan(*csr(own_ids, own_lens), HEADS, KV_HEADS, DIM, PAGE, **common)
    shared = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    m = len(group_of)
    qo = torch.zeros(len(SHARED_GROUPS) + 1, dtype=torch.int32)
    qo[1:] = torch.tensor([size for size, _ in SHARED_GROUPS], dtype=torch.int32).cumsum(0).clamp(max=m)
    shared.plan(qo, *csr(prefix_ids, [n for _, n in SHARED_GROUPS]), HEADS, KV_HEADS, DIM, PAGE, causal=False, **common)

    def run_plain() -> torch.Tensor:
        return plain.run(q, (k, v))

    def run_cascade() -> torch.Tensor:
        o, lse = own.run(q, (k, v), return_lse=True)
        o1, lse1 = shared.run(q[:m], (k, v), return_lse=True)
        flashinfer.merge_state_in_place(o[:m], lse[:m], o1, lse1)
        return o

    a, b = run_plain(), run_cascade()
    err = float((a.float() - b.float()).norm() / a.float().norm())
    total_tokens = sum(kv_lens)
    unique_tokens = sum(own_lens) + sum(n for _, n in SHARED_GROUPS)
    bytes_per_token = 2 * KV_HEADS * DIM * 2
    res = {"rows": rows, "kv_tokens": total_tokens, "unique_kv_tokens": unique_tokens, "rel_err": err}
    for name, fn in (("plain", run_plain), ("cascade", run_cascade), ("plain", run_plain), ("cascade", run_cascade)):
        us = time_us(fn)
        res.setdefault(name + "_us", []).append(us)
    for name in ("plain", "cascade"):
        us = min(res[name + "_us"])
        print(f"{name:8} {us:8.1f} us/layer  {total_tokens * bytes_per_token / us / 1e6:6.2f} TB/s of all KV tokens")
    print(f"KV tokens {total_tokens:,} ({unique_tokens:,} distinct)  rel err {err:.2e}")
    print(f"cascade / plain: {min(res['cascade_us']) / min(res['plain_us']):.3f}")
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
