"""Decode attention over shared prefixes, two ways, on one layer (GPU; issue #15). Run on the GPU machine:

    source .whl/use-bundle.sh && python benchmarks/shared_prefix_attention.py --out $OUT/shared_prefix.json

The batch is the saturated replay's running set (bench-trace traces/qwen_1000.jsonl --time-scale 0.2): 256 decode
rows, about 880k tokens of context, three groups of requests on one cached system prompt each (110, 81 and 65 rows on
2,016, 1,984 and 368 tokens, the group sizes and prefix lengths of 256 consecutive requests of the trace), the rest of
each context its own. Qwen3-0.6B's shapes (16 query heads, 8 KV heads, head_dim 128, bf16, page 16).
  plain     FlashInfer's tensor-core decode over every row's whole page list (what the engine runs): a shared
            prefix is read once per row (or hits in L2); its rows grouped by prefix
  plain-interleaved  the same with the rows in a random order (the groups interleaved, as in the engine's running
            list, which is in arrival order)
  cascade   the prefill kernel over each group's prefix (its rows as the queries, read once per group), the decode
            kernel over each row's own pages, both with their log-sum-exp, merged (flashinfer.merge_state_in_place)
  cascade-fa3  the same with FlashInfer's fa3 (Hopper) prefill kernel for the prefixes
  multilevel   flashinfer.MultiLevelCascadeAttentionWrapper, two levels (the prefixes, then each row's own pages; its
            prefill kernel for both); needs every row in a group (256 rows)
Timed over 30 calls after 5 warm-up calls; the outputs are compared with plain's. A variant that does not build or run
here is reported, not fatal. The distinct KV's read rate is what a kernel reading each shared page once would need.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

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
    ws3 = torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev)

    def csr(tables: list[list[int]], lens: list[int]):
        indptr = torch.zeros(len(tables) + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor([len(t) for t in tables], dtype=torch.int32).cumsum(0)
        indices = torch.tensor([p for t in tables for p in t], dtype=torch.int32, device=dev)
        last = torch.tensor([(n - 1) % PAGE + 1 for n in lens], dtype=torch.int32)
        return indptr, indices, last

    common = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    m = len(group_of)
    group_rows = [0] + torch.tensor([size for size, _ in SHARED_GROUPS]).cumsum(0).clamp(max=m).tolist()
    prefix_lens = [n for _, n in SHARED_GROUPS]

    def plain() -> Callable[[], torch.Tensor]:
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        w.plan(*csr(full_tables, kv_lens), HEADS, KV_HEADS, DIM, PAGE, **common)
        return lambda: w.run(q, (k, v))

    def interleaved() -> Callable[[], torch.Tensor]:
        # the same rows in a random order, as arrivals interleave the groups in the engine's running list (oldest first)
        perm = torch.randperm(rows, generator=g)
        back = torch.argsort(perm).to(dev)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws2, "NHD", use_tensor_cores=True)
        tables, lens = [full_tables[i] for i in perm], [kv_lens[i] for i in perm]
        w.plan(*csr(tables, lens), HEADS, KV_HEADS, DIM, PAGE, **common)
        qp = q[perm.to(dev)].contiguous()
        return lambda: w.run(qp, (k, v)).index_select(0, back)  # the gather back: ~1 MB, a few us

    def cascade(backend: str) -> Callable[[], torch.Tensor]:
        own = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws2, "NHD", use_tensor_cores=True)
        own.plan(*csr(own_ids, own_lens), HEADS, KV_HEADS, DIM, PAGE, **common)
        shared = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        qo = torch.tensor(group_rows, dtype=torch.int32)
        shared.plan(qo, *csr(prefix_ids, prefix_lens), HEADS, KV_HEADS, DIM, PAGE, causal=False, **common)

        def run() -> torch.Tensor:
            o, lse = own.run(q, (k, v), return_lse=True)
            o1, lse1 = shared.run(q[:m], (k, v), return_lse=True)
            flashinfer.merge_state_in_place(o[:m], lse[:m], o1, lse1)
            return o

        return run

    def multilevel() -> Callable[[], torch.Tensor]:
        if m < rows:
            raise ValueError(f"rows past the groups ({rows - m}) have no prefix level")
        w = flashinfer.MultiLevelCascadeAttentionWrapper(2, ws3, "NHD")
        top, bottom = csr(prefix_ids, prefix_lens), csr(own_ids, own_lens)
        qo = [torch.tensor(group_rows, dtype=torch.int32), torch.arange(rows + 1, dtype=torch.int32)]
        w.plan(qo, [top[0], bottom[0]], [top[1], bottom[1]], [top[2], bottom[2]], HEADS, KV_HEADS, DIM, PAGE, **common)
        return lambda: w.run(q, (k, v))

    makers = {
        "plain": plain,
        "plain-interleaved": interleaved,
        "cascade": lambda: cascade("auto"),
        "cascade-fa3": lambda: cascade("fa3"),
        "multilevel": multilevel,
    }
    total_tokens = sum(kv_lens)
    unique_tokens = sum(own_lens) + sum(prefix_lens)
    bytes_per_token = 2 * KV_HEADS * DIM * 2
    res: dict = {
        "rows": rows,
        "kv_tokens": total_tokens,
        "unique_kv_tokens": unique_tokens,
        "gpu": torch.cuda.get_device_name(),
    }
    fns: dict[str, Callable[[], torch.Tensor]] = {}
    for name, make in makers.items():
        try:
            fns[name] = make()
            out = fns[name]()
            ref = fns["plain"]() if name != "plain" else out
            res[name] = {"rel_err": float((out.float() - ref.float()).norm() / ref.float().norm()), "us": []}
        except Exception as e:  # noqa: BLE001  # a variant that does not build here is reported, not fatal
            fns.pop(name, None)
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{name:12} {res[name]['error']}")
    for _ in range(2):  # two rounds, interleaved
        for name, fn in fns.items():
            res[name]["us"].append(time_us(fn))
    for name in fns:
        us = min(res[name]["us"])
        all_rate, distinct_rate = total_tokens * bytes_per_token / us / 1e6, unique_tokens * bytes_per_token / us / 1e6
        print(f"{name:18} {us:8.1f} us/layer  {all_rate:6.2f} TB/s of all KV, {distinct_rate:5.2f} of the distinct KV  "
              f"rel err {res[name]['rel_err']:.2e}  ({us / min(res['plain']['us']):.3f}x plain)")  # fmt: skip
    print(f"KV tokens {total_tokens:,} ({unique_tokens:,} distinct)")
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
