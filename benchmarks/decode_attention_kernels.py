"""Decode attention kernels side by side on one layer's paged KV, bf16 or fp8 (GPU; issues #15 and #17). Run there:

    source .whl/use-bundle.sh && python benchmarks/decode_attention_kernels.py --out $OUT/decode_kernels.json

Each case is a batch of decode rows over one layer's pool, the pages of every sequence scattered as they are after
churn, its K/V stored in bf16 or in e4m3 (`--kv-cache-dtype fp8`, scale 1). Context lengths (`--lens`): `offline`
is the offline workload mid-run (prompt 100-1024 plus 0-1024 generated tokens), `replay` issue #15's saturated
replay (1,200-5,800 tokens), `shared` that replay's running set with its shared system prompts (three groups of
rows on one prefix's pages each, as benchmarks/shared_prefix_attention.py; the KV read rate counts every row's
tokens, so it exceeds the memory's where L2 serves a repeated page), `skewed` the offline lengths with the first
request at 32,768 tokens, `offline-desc` the offline rows sorted longest first, `offline-runN` the offline rows
with each request's pages in runs of N consecutive page ids (the runs scattered; `offline` scatters single
pages). Heads (`--heads Q/KV`):
Qwen3-0.6B's 16/8 by default; 32/8 is Llama-3.1-8B's, 16/2 one rank of Qwen3-32B at TP=4. Kernels:
  fi-tc        FlashInfer's tensor-core decode (the engine's choice), NHD pool [pages, page, heads, dim]
  fi-tc-nosplit  the same with disable_split_kv: no KV split across CTAs, so no merge kernel after it
  fi-tc-graph  the same through a CUDA-graph wrapper (fixed buffers), as the engine's graphs run it: always split;
               fi-tc-graph-splitN with fixed_split_size=N, which FlashInfer refuses in this mode (reported as such)
  fi-tc-splitN the same with fixed_split_size=N: each request's KV cut into chunks of N pages
  fi-tc-hnd    the same kernel on an HND pool [pages, heads, page, dim] (each head's page contiguous)
  fi-cc        FlashInfer's CUDA-core decode, NHD;  fi-cc-hnd  on HND
  fi-holistic  FlashInfer's BatchAttention: one persistent kernel for prefill and decode rows, the work (each request's
               KV in chunks) balanced over the SMs by its planner, the partial results merged inside the same launch
  fa4          FlashAttention-4's varlen forward (`flash_attn.cute`, the engine's `fa` backend) on the NHD pool through
               a page table, one query per request, no KV split; fa4-auto with FA4's own split heuristic
               (num_splits=0), fa4-splitN with N splits. Needs the FA4 bundle on the path (benchmarks/run_gpu_fa.sh
               decode); FA4 loads pages by TMA at page 128 (one key tile), by cp.async at other sizes
  xqa          FlashInfer's XQA decode kernel (TensorRT-LLM's GQA decode; over e4m3 on sm90 its Hopper fp8 kernel), NHD;
               xqa-hnd  on HND. The bundle of the twenty-third session lacks its sources: it does not build there
  cuda         the engine's decode over a bf16/fp16 pool (kernels/attention/cuda_decode.py, kernels/cuda/
               paged_decode.cu) as its wrapper plans it, without the split: its default shape, 8 warps, 2 stages, rows
               copied by cp.async.ca; -spans with the engine's split (span_decode_work; -pN: N programs per SM, else
               flashinfer_backend.CUDA_PROGRAMS_PER_SM); -wW -sS: W warps, S pipeline stages; -l0: the rows copied
               by cp.async.cg, -l1 by the copy engine (cp.async.bulk), -l2 by cp.async.ca, -l3 by plain loads and
               shared stores (the shapes built: paged_decode.cu's by_shape); -m0 / -m1: the same copies with no
               arithmetic on the pages, or only their rows read from shared memory and summed (wrong outputs: what
               the copies alone take); -tc / -cc: the products on the tensor cores (MMAs) or the CUDA cores (fp32
               FMAs), else cuda_decode.TENSOR_CORES; -desc: CTAs take the items longest first;
               -fused: a request's spans merged inside the kernel by the last to finish; -hnd: over an HND pool
               ([pages, kv_heads, page, 128]: a page's rows of one KV head contiguous), through its strides
  triton       the engine's decode over an fp8 pool (kernels/attention/fp8_decode.py; e4m3 only), one span per
               request; triton-spans with the engine's split (span_decode.span_decode_work: spans of one length,
               about FP8_PROGRAMS_PER_SM programs per SM; triton-spans-pN: N per SM); triton-uniform with the split
               before the spans (every request in the same number of parts, from the batch size alone). The
               candidates the kernel was chosen from (K/V widened in
               registers in either MMA order, a one-term e4m3 query) are in benchmarks/triton_paged_decode.py as of
               commit 4291d57, their figures in benchmarks/results/session23_h200/; the later ones that lost to it
               (benchmarks/fp8_decode_variants.py as of commit 9c7c077) in benchmarks/results/fp8_variants_s24/.
Each is timed over 30 back-to-back calls after 5 warm-up calls (CUDA events), with `--graph` replayed from a CUDA
graph (at small batches the eager calls time the host). The table gives us per call, the KV
read rate (bytes of K and V as stored / time), and the output's error against exact attention in fp32 over the
stored K/V (relative Frobenius norm; the fp8 rounding of K/V itself is not counted, only what each kernel adds).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engine.cache_paths import cache_root

DIM = 128
LENS = {"offline": ((100, 1025), (0, 1025)), "replay": ((1200, 5801), (0, 1))}
DTYPES = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}


def time_us(fn: Callable[[], torch.Tensor], iters: int = 30, graph: bool = False) -> float:
    """us per call over `iters` back-to-back calls after 5 warm-up calls. With `graph`, the calls are captured in one
    CUDA graph and replayed, as the engine runs its decode: the host's launch cost (tens of us for a Triton kernel
    from Python) drops out, which at small batches is more than the GPU's work."""
    for _ in range(5):
        fn()
    run = fn
    if graph:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        run = g.replay  # type: ignore[assignment]
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    if graph:
        run()
    else:
        for _ in range(iters):
            run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def longest_first(work: np.ndarray) -> np.ndarray:
    """The order in which CTAs take the work items [3, items] (request, first key, end key): the longest first, so
    that no long read starts last and runs alone at the end; unused items (request -1) last."""
    length = np.where(work[0] >= 0, work[2] - work[1], -1)
    return np.argsort(-length, kind="stable").astype(np.int32)


def reference(q, k, v, table: list[list[int]], lens: list[int], scale: float) -> torch.Tensor:
    """Exact attention in fp32 over the stored K/V, request by request."""
    heads, kv_heads = q.shape[1], k.shape[2]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for i, n in enumerate(lens):
        pages = torch.tensor(table[i], device=q.device, dtype=torch.long)
        kk = k[pages].flatten(0, 1)[:n].float().repeat_interleave(heads // kv_heads, 1)  # [n, heads, dim]
        vv = v[pages].flatten(0, 1)[:n].float().repeat_interleave(heads // kv_heads, 1)
        s = torch.einsum("hd,nhd->hn", q[i].float(), kk) * scale
        out[i] = torch.einsum("hn,nhd->hd", s.softmax(-1), vv)
    return out


SHARED_GROUPS = [(110, 2016), (81, 1984), (65, 368)]  # rows, prefix tokens (a whole number of pages)


@dataclass
class SharedBatch:
    """The saturated replay's running set: three groups of consecutive rows on one cached system prompt each
    (SHARED_GROUPS), each row's own tokens after it (rows past the groups have only their own)."""

    prefix_ids: list[list[int]]  # each group's prefix pages
    own_ids: list[list[int]]  # each row's own pages
    own_lens: list[int]
    group_of: list[int]  # the group of each grouped row
    pool_pages: int

    @classmethod
    def draw(cls, rows: int, page: int, g: torch.Generator) -> SharedBatch:
        own = torch.randint(600, 2400, (rows,), generator=g) + torch.randint(1, 700, (rows,), generator=g)
        own_lens = own.tolist()
        group_of = [gi for gi, (size, _) in enumerate(SHARED_GROUPS) for _ in range(size)][:rows]
        prefix_pages = [n // page for _, n in SHARED_GROUPS]
        own_pages = [-(-n // page) for n in own_lens]
        pool_pages = sum(prefix_pages) + sum(own_pages) + 8
        perm = torch.randperm(pool_pages, generator=g).to(torch.int32).tolist()
        ids, at = [], 0
        for n in prefix_pages + own_pages:
            ids.append(perm[at : at + n])
            at += n
        return cls(ids[: len(prefix_pages)], ids[len(prefix_pages) :], own_lens, group_of, pool_pages)

    def prefix(self, row: int) -> list[int]:
        return self.prefix_ids[self.group_of[row]] if row < len(self.group_of) else []

    def tables(self) -> list[list[int]]:
        return [self.prefix(i) + own for i, own in enumerate(self.own_ids)]

    def lens(self, page: int) -> list[int]:
        return [len(self.prefix(i)) * page + n for i, n in enumerate(self.own_lens)]


def case(
    batch: int, page: int, kernels: list[str], kv: str, lens_name: str, heads: int, kv_heads: int, graph: bool = False
) -> list[dict]:
    import flashinfer

    from kernels.attention.span_decode import FP8_PROGRAMS_PER_SM, SpanDecodeWrapper, SpanScratch

    g = torch.Generator().manual_seed(0)
    if lens_name == "shared":
        shared = SharedBatch.draw(batch, page, g)
        table_rows, lens, pool_pages = shared.tables(), torch.tensor(shared.lens(page)), shared.pool_pages
        perm = torch.tensor([p for t in table_rows for p in t], dtype=torch.int32)
        pages_per = [len(t) for t in table_rows]
    else:
        run = int(lens_name.partition("-run")[2] or 1)  # offline-runN: each request's pages in runs of N ids
        base_lens = "offline" if lens_name in ("skewed", "offline-desc") or "-run" in lens_name else lens_name
        (plo, phi), (glo, ghi) = LENS[base_lens]
        lens = torch.randint(plo, phi, (batch,), generator=g) + torch.randint(glo, ghi, (batch,), generator=g)
        if lens_name == "skewed":  # one long context among short ones: a chat on a long document beside others
            lens[0] = 32_768
        if lens_name == "offline-desc":  # the same rows, longest first: CTAs start in row order, so the tail is short
            lens = lens.sort(descending=True).values
        pages_per = [(int(n) + page - 1) // page for n in lens]
        total_pages = sum(pages_per)
        pool_pages = int(total_pages * 1.25) + 8
        perm = torch.randperm(pool_pages, generator=g)[:total_pages].to(torch.int32)
        if run > 1:  # runs of `run` consecutive page ids, the runs scattered over the pool
            runs = [torch.arange(n) for n in pages_per]
            pool_pages = max(pool_pages, (total_pages // run + batch + 1) * run)
            order = torch.randperm(pool_pages // run, generator=g)
            ids: list[int] = []
            k = 0
            for r in runs:
                for a in range(0, len(r), run):
                    ids += range(int(order[k]) * run, int(order[k]) * run + min(run, len(r) - a))
                    k += 1
            perm = torch.tensor(ids, dtype=torch.int32)
    dev = torch.device("cuda")
    dtype = DTYPES[kv]
    k_nhd = torch.randn(pool_pages, page, kv_heads, DIM, device=dev, dtype=torch.bfloat16).to(dtype)
    v_nhd = torch.randn(pool_pages, page, kv_heads, DIM, device=dev, dtype=torch.bfloat16).to(dtype)
    k_hnd, v_hnd = k_nhd.transpose(1, 2).contiguous(), v_nhd.transpose(1, 2).contiguous()
    q = torch.randn(batch, heads, DIM, device=dev, dtype=torch.bfloat16)
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(pages_per, dtype=torch.int32).cumsum(0)
    indices = perm.to(dev)
    last = torch.tensor([(int(n) - 1) % page + 1 for n in lens], dtype=torch.int32)
    if lens_name != "shared":
        table_rows = [perm[indptr[i] : indptr[i + 1]].tolist() for i in range(batch)]
    table = torch.zeros(batch, max(pages_per), dtype=torch.int32)
    for i, ids in enumerate(table_rows):
        table[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
    table_d, lens_d = table.to(dev), lens.to(dev, torch.int32)
    ws = torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev)
    scale = DIM**-0.5

    def fi(tc: bool, layout: str, **plan: bool | int) -> Callable[[], torch.Tensor]:
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=tc)
        w.plan(indptr, indices, last, heads, kv_heads, DIM, page, q_data_type=torch.bfloat16, kv_data_type=dtype,
               sm_scale=scale, **plan)  # fmt: skip
        cache = (k_nhd, v_nhd) if layout == "NHD" else (k_hnd, v_hnd)
        return lambda: w.run(q, cache)

    def fi_graph(**plan: int) -> Callable[[], torch.Tensor]:
        # the engine's CUDA-graph wrapper (fixed buffers; FlashInfer then always splits the KV, as in the engine)
        ind = torch.zeros(max(int(indptr[-1]), 1), dtype=torch.int32, device=dev)
        bufs = dict(paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32, device=dev),
                    paged_kv_indices_buffer=ind, paged_kv_last_page_len_buffer=torch.zeros(batch, dtype=torch.int32,
                    device=dev))  # fmt: skip
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, use_tensor_cores=True, **bufs)
        w.plan(indptr, indices, last, heads, kv_heads, DIM, page, q_data_type=torch.bfloat16, kv_data_type=dtype,
               sm_scale=scale, **plan)  # fmt: skip
        return lambda: w.run(q, (k_nhd, v_nhd))

    def holistic() -> Callable[[], torch.Tensor]:
        w = flashinfer.BatchAttention("NHD")
        qo = torch.arange(batch + 1, dtype=torch.int32, device=dev)
        w.plan(qo, indptr.to(dev), indices, lens_d, heads, kv_heads, DIM, DIM, page, sm_scale=scale,
               q_data_type=torch.bfloat16, kv_data_type=dtype)  # fmt: skip
        return lambda: w.run(q, (k_nhd, v_nhd))[0]

    def xqa(layout: str) -> Callable[[], torch.Tensor]:
        xws = torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev)
        cache = (k_nhd, v_nhd) if layout == "NHD" else (k_hnd, v_hnd)
        return lambda: flashinfer.decode.xqa_batch_decode_with_kv_cache(
            q, cache, xws, table_d, lens_d, int(lens.max()), bmm1_scale=scale, kv_layout=layout
        )

    def triton_kernel(name: str) -> Callable[[], torch.Tensor]:
        if dtype != torch.float8_e4m3fn:
            raise ValueError("the Triton decode reads an fp8 pool only")
        name, _, per_sm = name.partition("-p")
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        slots = int(per_sm or FP8_PROGRAMS_PER_SM) * sms  # as flashinfer_backend's
        w = SpanDecodeWrapper(slots, SpanScratch(dev))
        w.plan(indptr, indices, last, heads, kv_heads, DIM, page, sm_scale=scale, disable_split_kv=name == "triton")
        if name == "triton-uniform":  # the split before the spans: every request in the same number of equal parts
            splits = min(SpanDecodeWrapper.MAX_SPANS, max(2, -(-2 * sms // (batch * kv_heads))))
            per = [-(-int(n) // splits) for n in lens]
            chunk = [-(-c // 128) * 128 for c in per]  # as the kernel cut them: whole steps of 128 keys
            work = [(r, a, min(int(n), a + chunk[r])) for r, n in enumerate(lens) for a in range(0, int(n), chunk[r])]
            w.work = torch.tensor(work, dtype=torch.int32, device=dev).T.contiguous()
            counts = torch.bincount(w.work[0], minlength=batch)
            w.work_ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
            buf = SpanScratch(dev).get(len(work) * heads * (DIM + 1))
            w.part, w.lse = buf[: len(work) * heads * DIM], buf[len(work) * heads * DIM :]

        return lambda: w.run(q, (k_nhd, v_nhd))

    def cuda_kernel(name: str) -> Callable[[], torch.Tensor]:
        # cuda[-spans][-pN][-wW][-sS][-lL][-desc][-ht][-fused][-hnd]: the CUDA decode on SpanDecodeWrapper's
        # plan (the engine's: cuda-ht, span_decode.CUDA_HEADS_TOGETHER)
        from kernels.attention import cuda_decode
        from kernels.attention.flashinfer_backend import CUDA_PROGRAMS_PER_SM

        opts = name.split("-")[1:]
        val = {o[0]: int(o[1:]) for o in opts if o[:1] in "pwslm" and o[1:].isdigit()}
        shape: dict = dict(warps=val.get("w", cuda_decode.WARPS), stages=val.get("s", cuda_decode.STAGES))
        shape["copy"] = val.get("l", cuda_decode.COPY)
        engines = (cuda_decode.WARPS, cuda_decode.STAGES, cuda_decode.COPY)
        if (shape["warps"], shape["stages"], shape["copy"]) != engines:
            shape["flags"] = cuda_decode.ALL_SHAPES
        if "tc" in opts or "cc" in opts:  # the products on the tensor cores, or the CUDA cores (else the engine's)
            shape["tensor_cores"] = "tc" in opts
        if "m" in val:  # -m0 / -m1: paged_decode.cu's PAGED_DECODE_MATH
            shape["flags"] = (*shape.get("flags", ()), f"-DPAGED_DECODE_MATH={val['m']}")
        if why := cuda_decode.load(cache_root() / "cuda", dev, shape.get("flags", ())):
            raise RuntimeError(why)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        w = SpanDecodeWrapper(val.get("p", CUDA_PROGRAMS_PER_SM) * sms, SpanScratch(dev), kernel="cuda")
        w.plan(indptr, indices, last, heads, kv_heads, DIM, page, sm_scale=scale, disable_split_kv="spans" not in opts)
        spans = (w.work, w.work_ptr, w.sm_scale, w.part, w.lse)
        if "desc" in opts:  # CTAs take the items longest first
            shape["order"] = torch.from_numpy(longest_first(w.work.cpu().numpy())).to(dev)
        if "ht" in opts:  # a work item's KV heads in consecutive CTAs (a flat grid)
            shape["heads_together"] = True
        if "fused" in opts:  # the spans merged inside the kernel
            shape["counters"] = torch.zeros(batch * kv_heads, dtype=torch.int32, device=dev)
        k, v = (k_hnd.transpose(1, 2), v_hnd.transpose(1, 2)) if "hnd" in opts else (k_nhd, v_nhd)  # -hnd: HND pool
        return lambda: cuda_decode.decode(q, k, v, w.indptr, w.indices, *spans, **shape)

    def fa4(splits: int) -> Callable[[], torch.Tensor]:
        from kernels.attention.fa_backend import import_fa4

        attn = import_fa4()
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=dev)
        max_k = int(lens.max())
        return lambda: attn(q, k_nhd, v_nhd, cu_seqlens_q=cu_q, seqused_k=lens_d, page_table=table_d, max_seqlen_q=1,
                            max_seqlen_k=max_k, softmax_scale=scale, causal=False, num_splits=splits)[0]  # fmt: skip

    makers: dict[str, Callable[[], Callable[[], torch.Tensor]]] = {
        "fa4": lambda: fa4(1),
        "fa4-auto": lambda: fa4(0),
        "fi-tc": lambda: fi(True, "NHD"),
        "fi-tc-nosplit": lambda: fi(True, "NHD", disable_split_kv=True),
        "fi-tc-graph": fi_graph,
        "fi-tc-hnd": lambda: fi(True, "HND"),
        "fi-cc": lambda: fi(False, "NHD"),
        "fi-holistic": holistic,
        "fi-cc-hnd": lambda: fi(False, "HND"),
        "xqa": lambda: xqa("NHD"),
        "xqa-hnd": lambda: xqa("HND"),
    }
    for n in (4, 8, 16, 32, 64):
        makers[f"fi-tc-split{n}"] = functools.partial(fi, True, "NHD", fixed_split_size=n)
        makers[f"fi-tc-graph-split{n}"] = functools.partial(fi_graph, fixed_split_size=n)
    for n in (2, 3, 4, 8):
        makers[f"fa4-split{n}"] = functools.partial(fa4, n)
    ref = reference(q, k_nhd, v_nhd, table_rows, lens.tolist(), scale)
    kv_bytes = int(lens.sum()) * kv_heads * DIM * 2 * k_nhd.element_size()
    rows = []
    for name in kernels:
        row: dict = dict(kernel=name, kv=kv, lens=lens_name, heads=f"{heads}/{kv_heads}", batch=batch, page=page,
                         graph=graph, kv_tokens=int(lens.sum()))  # fmt: skip
        try:
            if name.startswith("triton"):
                fn = triton_kernel(name)
            elif name.startswith("cuda"):
                fn = cuda_kernel(name)
            else:
                fn = makers[name]()
            out = fn().float()
            row["rel_err"] = float((out - ref).norm() / ref.norm())
            us = time_us(fn, graph=graph)
            row.update(us=us, tb_per_s=kv_bytes / us / 1e6)
            after = fn().float()  # a call after the timed ones (a kernel's counters must be back to zero)
            row["rel_err_after"] = float((after - ref).norm() / ref.norm())
        except Exception as e:  # noqa: BLE001  # a kernel that does not build or run here is reported, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        label = f"{kv} {lens_name:7} {heads}/{kv_heads} batch {batch:4} page {page:3} {name:18}"
        print(label, f"{row['us']:8.1f} us {row['tb_per_s']:5.2f} TB/s err {row['rel_err']:.2e} "
              f"{row['rel_err_after']:.2e}" if "us" in row
              else row["error"], flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="256,128,32")
    ap.add_argument("--pages", default="16")
    ap.add_argument("--kv-dtypes", default="bf16,e4m3")
    ap.add_argument("--lens", default="offline")
    ap.add_argument("--heads", default="16/8")
    ap.add_argument("--kernels", default="fi-tc,fi-tc-nosplit,fi-cc,xqa,triton")
    ap.add_argument("--repeat", type=int, default=1, help="run each case again (the first includes JIT builds)")
    ap.add_argument("--graph", action="store_true", help="time the calls replayed from a CUDA graph (time_us)")
    ap.add_argument("--out")
    args = ap.parse_args()
    kernels = args.kernels.split(",")
    rows = []
    for lens_name in args.lens.split(","):
        for hk in args.heads.split(","):
            heads, kv_heads = map(int, hk.split("/"))
            for kv in args.kv_dtypes.split(","):
                for page in map(int, args.pages.split(",")):
                    for batch in map(int, args.batches.split(",")):
                        for rep in range(1 + args.repeat):
                            got = case(batch, page, kernels, kv, lens_name, heads, kv_heads, args.graph)
                            rows += [dict(r, repeat=rep) for r in got]
    if args.out:
        with open(args.out, "w") as f:
            meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
            json.dump(dict(meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
