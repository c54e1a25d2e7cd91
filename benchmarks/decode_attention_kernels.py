"""Decode attention kernels side by side on one layer's paged KV (GPU; issue #17). Run on the GPU machine:

    source .whl/use-bundle.sh && python benchmarks/decode_attention_kernels.py --out $OUT/decode_kernels.json

Qwen3-0.6B's shapes (16 query heads, 8 KV heads, head_dim 128, bf16). Each case is a batch of decode rows whose
context lengths follow the offline workload mid-run (prompt 100-1024 plus 0-1024 generated tokens), with the pages
of every sequence scattered over the pool as they are after churn. Kernels:
  fi-tc        FlashInfer's tensor-core decode (the engine's choice), NHD pool [pages, page, heads, dim]
  fi-tc-nosplit  the same with disable_split_kv: no KV split across CTAs, so no merge kernel after it
  fi-tc-splitN the same with fixed_split_size=N: each request's KV cut into chunks of N pages
  fi-tc-hnd    the same kernel on an HND pool [pages, heads, page, dim] (each head's page contiguous)
  fi-cc        FlashInfer's CUDA-core decode, NHD;  fi-cc-hnd  on HND
  xqa          FlashInfer's XQA decode kernel (TensorRT-LLM's GQA decode), NHD;  xqa-hnd  on HND
Each is timed over 30 back-to-back calls after 5 warm-up calls (CUDA events), and its output is checked against
fi-tc's. The table gives us per call and the KV read bandwidth (bytes of K and V / time).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable

import torch

HEADS, KV_HEADS, DIM = 16, 8, 128


def time_us(fn: Callable[[], torch.Tensor], iters: int = 30) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def case(batch: int, page: int, kernels: list[str], seed: int = 0) -> list[dict]:
    import flashinfer

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(100, 1025, (batch,), generator=g) + torch.randint(0, 1025, (batch,), generator=g)
    pages_per = [(int(n) + page - 1) // page for n in lens]
    total_pages = sum(pages_per)
    pool_pages = int(total_pages * 1.25) + 8
    perm = torch.randperm(pool_pages, generator=g)[:total_pages].to(torch.int32)
    dev = torch.device("cuda")
    k_nhd = torch.randn(pool_pages, page, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16)
    v_nhd = torch.randn(pool_pages, page, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16)
    k_hnd, v_hnd = k_nhd.transpose(1, 2).contiguous(), v_nhd.transpose(1, 2).contiguous()
    q = torch.randn(batch, HEADS, DIM, device=dev, dtype=torch.bfloat16)
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(pages_per, dtype=torch.int32).cumsum(0)
    indices = perm.to(dev)
    last = torch.tensor([(int(n) - 1) % page + 1 for n in lens], dtype=torch.int32)
    max_pages = max(pages_per)
    table = torch.zeros(batch, max_pages, dtype=torch.int32)
    for i in range(batch):
        table[i, : pages_per[i]] = perm[indptr[i] : indptr[i + 1]]
    table_d, lens_d = table.to(dev), lens.to(dev, torch.int32)
    ws = torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev)
    scale = DIM**-0.5

    def fi(tc: bool, layout: str, **plan: bool | int) -> Callable[[], torch.Tensor]:
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=tc)
        w.plan(indptr, indices, last, HEADS, KV_HEADS, DIM, page, q_data_type=torch.bfloat16, sm_scale=scale, **plan)
        kv = (k_nhd, v_nhd) if layout == "NHD" else (k_hnd, v_hnd)
        return lambda: w.run(q, kv)

    def xqa(layout: str) -> Callable[[], torch.Tensor]:
        xws = torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev)
        kv = (k_nhd, v_nhd) if layout == "NHD" else (k_hnd, v_hnd)
        return lambda: flashinfer.decode.xqa_batch_decode_with_kv_cache(
            q, kv, xws, table_d, lens_d, int(lens.max()), bmm1_scale=scale, kv_layout=layout
        )

    makers: dict[str, Callable[[], Callable[[], torch.Tensor]]] = {
        "fi-tc": lambda: fi(True, "NHD"),
        "fi-tc-nosplit": lambda: fi(True, "NHD", disable_split_kv=True),
        "fi-tc-hnd": lambda: fi(True, "HND"),
        "fi-cc": lambda: fi(False, "NHD"),
        "fi-cc-hnd": lambda: fi(False, "HND"),
        "xqa": lambda: xqa("NHD"),
        "xqa-hnd": lambda: xqa("HND"),
    }
    for n in (4, 8, 16, 32, 64):
        makers[f"fi-tc-split{n}"] = functools.partial(fi, True, "NHD", fixed_split_size=n)
    kv_bytes = int(lens.sum()) * KV_HEADS * DIM * 2 * 2
    ref = makers["fi-tc"]()().float()
    rows = []
    for name in kernels:
        row: dict = dict(kernel=name, batch=batch, page=page, kv_tokens=int(lens.sum()))
        try:
            fn = makers[name]()
            out = fn().float()
            row["max_abs_diff_vs_fi_tc"] = float((out - ref).abs().max())
            us = time_us(fn)
            row.update(us=us, tb_per_s=kv_bytes / us / 1e6)
        except Exception as e:  # noqa: BLE001  # a kernel that does not build or run here is reported, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        print(
            f"batch {batch:4} page {page:3} {name:10}",
            f"{row['us']:8.1f} us {row['tb_per_s']:5.2f} TB/s diff {row['max_abs_diff_vs_fi_tc']:.3g}"
            if "us" in row
            else row["error"],
            flush=True,
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="256,128,32")
    ap.add_argument("--pages", default="16,32")
    ap.add_argument("--kernels", default="fi-tc,fi-tc-hnd,fi-cc,fi-cc-hnd,xqa,xqa-hnd")
    ap.add_argument("--out")
    args = ap.parse_args()
    kernels = args.kernels.split(",")
    rows = []
    for page in map(int, args.pages.split(",")):
        for batch in map(int, args.batches.split(",")):
            rows += case(batch, page, kernels)
            # the same case again: the first pass includes JIT builds and a cold GPU's clocks
            rows += [dict(r, repeat=1) for r in case(batch, page, kernels)]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
