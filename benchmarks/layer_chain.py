"""A decode step's layers without attention, at Qwen3-0.6B's shapes, four ways (issue #17). GPU only:

    source .whl/use-bundle.sh && python benchmarks/layer_chain.py --out $OUT/layer_chain.json

Per layer: RMSNorm(x + residual) -> qkv -> o (on the q part) -> RMSNorm(x + residual) -> gate_up -> SiLU*up -> down,
28 layers with their own weights (so L2 holds no layer's weights between uses, as in the model), captured in one
CUDA graph, timed per layer:
- `cublas`: today's kernels (Triton RMSNorm and SiLU, cuBLAS GEMMs): 7 kernels per layer;
- `triton`: the Triton GEMM below with the norms and SiLU folded in (the norm's two passes over each row, the
  SiLU as a second accumulator on the up rows; rounded where the separate kernels round): 4 kernels per layer;
- `triton-pdl`: the same launched with programmatic dependent launch, each GEMM pulling its weights into L2
  before it waits for the previous kernel;
- `triton-pdl-noprefetch`: PDL without the L2 prefetch;
- `cublas-pdl`: today's kernels with only RMSNorm and SiLU launched with PDL (`cublas-again` repeats `cublas`);
- `split`, `split-pdl`: the plain Triton GEMMs between today's RMSNorm and SiLU kernels (7 kernels), without and
  with PDL on all of them (each kernel waits for its input, then lets the next one launch; a GEMM first pulls its
  weights into L2).

H100 (docs/gpu.md): the fused Triton chain took 1.2-2.8x today's time at every M (at 256 rows 110 vs 39 us per
layer); `split-pdl` tied cuBLAS up to 64 rows and lost above (48.6 vs 39.3 us at 256): PDL buys 1-2 us per layer.
So the engine keeps cuBLAS, and these kernels live here only as the record of that A/B.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from gemm_shapes import graph_us  # this script's folder is on sys.path when run as a script

from kernels import triton_ops

HIDDEN, INTER, Q, KV, LAYERS, EPS = 1024, 3072, 2048, 1024, 28, 1e-6
HEADS, KV_HEADS, DIM, PAGE = 16, 8, 128, 16  # attention heads and the KV pool's page, for DecodeBatch


@triton.jit
def _prefetch_rows(w_ptr, rows, sw, N, K, LINES: tl.constexpr):
    """Ask L2 for W[rows, :K], one request per 128-byte line (fire and forget: nothing waits for the data)."""
    rows = tl.minimum(rows, N - 1)
    for k0 in range(0, K, LINES * 64):
        cols = tl.minimum(k0 + tl.arange(0, LINES) * 64, K - 1)
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;",
            "=r,l",
            [w_ptr + rows[:, None] * sw + cols[None, :]],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit
def _load_a(x_ptr, res_ptr, nw_ptr, rm, k, M, K, sx, sr, rs, NORM: tl.constexpr):
    """One [BM, BK] tile of the GEMM's input, normalized when NORM (1: RMSNorm(x), 2: RMSNorm(x + residual))."""
    mask = (rm[:, None] < M) & (k[None, :] < K)
    a = tl.load(x_ptr + rm[:, None] * sx + k[None, :], mask=mask, other=0.0)
    if NORM == 2:
        r = tl.load(res_ptr + rm[:, None] * sr + k[None, :], mask=mask, other=0.0)
        a = (a.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
    if NORM > 0:
        w = tl.load(nw_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        y = (a.to(tl.float32) * rs[:, None]).to(x_ptr.dtype.element_ty)
        a = (y.to(tl.float32) * w[None, :]).to(x_ptr.dtype.element_ty)
    return a


@triton.jit
def _linear_kernel(
    x_ptr,
    res_ptr,
    nw_ptr,
    res_out_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    sx,
    sr,
    sro,
    sw,
    sy,
    eps,
    NORM: tl.constexpr,
    SILU: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m  # the M blocks of one weight tile run side by side: W comes from HBM about once
    pid_n = pid // num_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if PDL:
        if PREFETCH:
            if pid_m == 0:
                _prefetch_rows(w_ptr, rn, sw, N, K, 8)
                if SILU:
                    _prefetch_rows(w_ptr + N * sw, rn, sw, N, K, 8)
        tl.extra.cuda.gdc_wait()  # the previous kernel's output (x, residual) is visible from here on
        tl.extra.cuda.gdc_launch_dependents()  # after the wait: a trigger before it lets a chain of waiters pile up
    rs = tl.zeros((BM,), dtype=tl.float32)
    if NORM > 0:
        ss = tl.zeros((BM,), dtype=tl.float32)
        for k0 in range(0, K, BK):
            k = k0 + rk
            mask = (rm[:, None] < M) & (k[None, :] < K)
            a = tl.load(x_ptr + rm[:, None] * sx + k[None, :], mask=mask, other=0.0)
            if NORM == 2:
                r = tl.load(res_ptr + rm[:, None] * sr + k[None, :], mask=mask, other=0.0)
                a = (a.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
                if pid_n == 0:
                    tl.store(res_out_ptr + rm[:, None] * sro + k[None, :], a, mask=mask)
            af = a.to(tl.float32)
            ss += tl.sum(af * af, axis=1)
        rs = tl.rsqrt(ss / K + eps)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + rk
        a = _load_a(x_ptr, res_ptr, nw_ptr, rm, k, M, K, sx, sr, rs, NORM)
        wmask = (rn[:, None] < N) & (k[None, :] < K)
        b = tl.load(w_ptr + rn[:, None] * sw + k[None, :], mask=wmask, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        if SILU:
            bu = tl.load(w_ptr + (rn[:, None] + N) * sw + k[None, :], mask=wmask, other=0.0)
            acc_up = tl.dot(a, tl.trans(bu), acc_up)
    dt = y_ptr.dtype.element_ty
    if SILU:
        g = acc.to(dt).to(tl.float32)
        out = (g * tl.sigmoid(g)).to(dt).to(tl.float32) * acc_up.to(dt).to(tl.float32)
    else:
        out = acc
    tl.store(y_ptr + rm[:, None] * sy + rn[None, :], out.to(dt), mask=(rm[:, None] < M) & (rn[None, :] < N))


def config(m: int, n: int, silu: bool) -> tuple[int, int, int, int, int]:
    """(BM, BN, BK, warps, stages) for m rows and n outputs."""
    bm = 16 if m <= 16 else 64
    bn = 32 if silu or n <= 2048 or m <= 128 else 64
    return bm, bn, 128, 4, 4 if bn == 32 else 3


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    silu: bool = False,
    pdl: bool = False,
    prefetch: bool = True,
    tile: tuple[int, int, int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """y = f(x) W^T and the new residual (None without `residual`).

    f(x) is x, RMSNorm(x) with `norm_weight`, or RMSNorm(x + residual) with both (x + residual is returned as the
    new residual, in a new tensor). With `silu`, W is [gate | up] ([2N, K]) and y = SiLU(x Wg^T) * (x Wu^T), [M, N].
    """
    m, k = x.shape
    n = w.shape[0] // 2 if silu else w.shape[0]
    assert w.shape[1] == k and x.stride(1) == 1 and w.stride(1) == 1
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    norm = 0 if norm_weight is None else 2 if residual is not None else 1
    res_out = torch.empty_like(x) if residual is not None else None
    bm, bn, bk, warps, stages = tile or config(m, n, silu)
    if m:
        res = residual if residual is not None else x
        _linear_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](
            x,
            res,
            norm_weight if norm_weight is not None else x,
            res_out if res_out is not None else x,
            w,
            y,
            m,
            n,
            k,
            x.stride(0),
            res.stride(0),
            res_out.stride(0) if res_out is not None else 0,
            w.stride(0),
            y.stride(0),
            eps,
            NORM=norm,
            SILU=silu,
            PDL=pdl,
            PREFETCH=prefetch,
            BM=bm,
            BN=bn,
            BK=bk,
            num_warps=warps,
            num_stages=stages,
            launch_pdl=pdl,
        )
    return y, res_out


@triton.jit
def _rmsnorm_pdl_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n, eps, PDL: tl.constexpr, BLOCK: tl.constexpr):
    """kernels/triton_ops.rmsnorm with the residual, launched with PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    x = (x + tl.load(res_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)).to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + row * n + cols, x, mask=mask)
    x = x.to(tl.float32)
    y = (x * tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_pdl_kernel(x_ptr, out_ptr, n, PDL: tl.constexpr, BLOCK: tl.constexpr):
    """kernels/triton_ops.silu_and_mul, launched with PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(x_ptr + row * 2 * n + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * n + n + cols, mask=mask, other=0.0).to(tl.float32)
    y = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32) * up
    tl.store(out_ptr + row * n + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_pdl(x: torch.Tensor, w: torch.Tensor, res: torch.Tensor, pdl: bool) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.shape[1]
    _rmsnorm_pdl_kernel[(x.shape[0],)](x, res, w, out, n, EPS, pdl, triton.next_power_of_2(n), launch_pdl=pdl)
    return out


def silu_pdl(x: torch.Tensor, pdl: bool) -> torch.Tensor:
    n = x.shape[1] // 2
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    _silu_pdl_kernel[(x.shape[0], triton.cdiv(n, 1024))](x, out, n, pdl, 1024, launch_pdl=pdl)
    return out


def layer_weights(dev: torch.device) -> list[dict[str, torch.Tensor]]:
    """Each layer's projections and norm weights, bf16, at Qwen3-0.6B's shapes (random, N(0, 0.02) and 1 +- 0.1)."""

    def rnd(*shape: int, scale: float = 0.02) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=torch.bfloat16) * scale

    return [
        dict(
            qkv=rnd(Q + 2 * KV, HIDDEN),
            o=rnd(HIDDEN, Q),
            gu=rnd(2 * INTER, HIDDEN),
            down=rnd(HIDDEN, INTER),
            n1=1 + rnd(HIDDEN, scale=0.1),
            n2=1 + rnd(HIDDEN, scale=0.1),
        )
        for _ in range(LAYERS)
    ]


@dataclass
class DecodeBatch:
    """A decode step's paged KV for every layer, at the offline workload's context lengths mid-run (prompt 100-1024
    plus 0-1024 generated tokens), each row's pages scattered over the pool as they are after churn. Shared by the
    benchmarks that time whole decode steps (two_stream_overlap, prefill_decode_overlap, l2_prefetch, layer_ablation).
    """

    lens: torch.Tensor  # [rows] context lengths
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: K and V pools [pages, PAGE, KV_HEADS, DIM]
    indptr: torch.Tensor  # [rows + 1] int32 (host): row i's pages are pages[indptr[i]:indptr[i + 1]]
    pages: torch.Tensor  # int32 (host)
    last: torch.Tensor  # [rows] int32 (host): tokens in each row's last page

    @classmethod
    def draw(cls, rows: int, g: torch.Generator, dev: torch.device, layers: int = LAYERS) -> DecodeBatch:
        lens = torch.randint(100, 1025, (rows,), generator=g) + torch.randint(0, 1025, (rows,), generator=g)
        per_row = [(int(n) + PAGE - 1) // PAGE for n in lens]
        pool = int(sum(per_row) * 1.25) + 8
        bf = torch.bfloat16
        kv = [
            (
                torch.randn(pool, PAGE, KV_HEADS, DIM, device=dev, dtype=bf),
                torch.randn(pool, PAGE, KV_HEADS, DIM, device=dev, dtype=bf),
            )
            for _ in range(layers)
        ]
        pages = torch.randperm(pool, generator=g)[: sum(per_row)].to(torch.int32)
        indptr = torch.zeros(rows + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor(per_row, dtype=torch.int32).cumsum(0)
        last = torch.tensor([(int(n) - 1) % PAGE + 1 for n in lens], dtype=torch.int32)
        return cls(lens, kv, indptr, pages, last)

    def rope_store(self, dev: torch.device) -> Callable[[torch.Tensor, int], torch.Tensor]:
        """The engine's fused q/k norm + rope + KV store for each row's new token (the last slot of its last page):
        `store(qkv, layer)` writes K and V into that layer's pool and returns q [rows, HEADS, DIM]."""
        bf = torch.bfloat16
        slots = (self.pages[self.indptr[1:] - 1].long() * PAGE + self.last.long() - 1).to(dev)
        pos = (self.lens - 1).to(dev)
        freqs = torch.outer(torch.arange(4096, dtype=torch.float32), 1e6 ** (-torch.arange(0, DIM, 2) / DIM))
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dev)
        qn, kn = torch.ones(DIM, device=dev, dtype=bf), torch.ones(DIM, device=dev, dtype=bf)

        def store(qkv: torch.Tensor, layer: int) -> torch.Tensor:
            q = qkv[:, :Q].view(-1, HEADS, DIM)
            k = qkv[:, Q : Q + KV_HEADS * DIM].view(-1, KV_HEADS, DIM)
            v = qkv[:, Q + KV_HEADS * DIM :].view(-1, KV_HEADS, DIM)
            k_pool, v_pool = self.kv[layer]
            triton_ops.qk_norm_rope_store(q, k, v, qn, kn, EPS, cos_sin, pos, k_pool, v_pool, slots)
            return q

        return store

    def wrapper(self, dev: torch.device, lo: int = 0, hi: int | None = None):
        """FlashInfer's tensor-core decode planned for rows [lo, hi), with fixed metadata buffers as the engine's
        CUDA graphs use."""
        import flashinfer

        hi = len(self.lens) if hi is None else hi
        ip = self.indptr[lo : hi + 1] - self.indptr[lo]
        ids = self.pages[int(self.indptr[lo]) : int(self.indptr[hi])].to(dev)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev),
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.zeros(hi - lo + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=torch.zeros(len(ids), dtype=torch.int32, device=dev),
            paged_kv_last_page_len_buffer=torch.zeros(hi - lo, dtype=torch.int32, device=dev),
        )
        w.plan(ip, ids, self.last[lo:hi], HEADS, KV_HEADS, DIM, PAGE, q_data_type=torch.bfloat16,
               sm_scale=DIM**-0.5)  # fmt: skip
        return w


def interleaved_step_ms(
    step,
    modes: Sequence[str],
    x0: torch.Tensor,
    r0: torch.Tensor,
    rounds: int,
    skip: int,
    edit: Callable[[str, int], None] | None = None,
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Each mode's `step(mode, x, residual) -> out` captured in a CUDA graph, then the graphs replayed in turn for
    `rounds` rounds (so a clock or neighbour drift hits every mode alike) from the same inputs. Returns each mode's
    median ms per replay after the first `skip` rounds, and its output (fp32). `edit(mode, cudaGraph_t)` may change
    each captured graph before it is instantiated (pdl_edges.py)."""
    graphs = {}
    for mode in modes:
        xs, rs = x0.clone(), r0.clone()
        step(mode, xs.clone(), rs.clone())  # compile outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph(keep_graph=edit is not None)
        with torch.cuda.graph(graph):
            y = step(mode, xs, rs)
        if edit is not None:
            edit(mode, graph.raw_cuda_graph())
            graph.instantiate()
        graphs[mode] = (graph, xs, rs, y)
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode in modes:
            graph, xs, rs, y = graphs[mode]
            xs.copy_(x0)
            rs.copy_(r0)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            times[mode].append(a.elapsed_time(b))
    outs = {mode: g[3].float().clone() for mode, g in graphs.items()}
    return {m: statistics.median(t[skip:]) for m, t in times.items()}, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,8,32,64,128,192,256")
    ap.add_argument("--out", default="layer_chain.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bf = torch.bfloat16

    def rnd(*shape: int, scale: float = 0.02) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=bf) * scale

    layers = layer_weights(dev)

    def layer_cublas(state: list[torch.Tensor], w: dict) -> None:
        x, res = state
        h = triton_ops.rmsnorm(x, w["n1"], EPS, res)  # res updated in place
        qkv = F.linear(h, w["qkv"])
        o = F.linear(qkv[:, :Q], w["o"])
        h = triton_ops.rmsnorm(o, w["n2"], EPS, res)
        state[0] = F.linear(triton_ops.silu_and_mul(F.linear(h, w["gu"])), w["down"])

    def layer_cublas_pdl(state: list[torch.Tensor], w: dict) -> None:
        x, res = state  # today's kernels, RMSNorm and SiLU launched with PDL (they wait, then let the next launch)
        h = rmsnorm_pdl(x, w["n1"], res, True)
        o = F.linear(F.linear(h, w["qkv"])[:, :Q], w["o"])
        h = rmsnorm_pdl(o, w["n2"], res, True)
        state[0] = F.linear(silu_pdl(F.linear(h, w["gu"]), True), w["down"])

    def layer_triton(state: list[torch.Tensor], w: dict, pdl: bool, prefetch: bool) -> None:
        qkv, res1 = linear(state[0], w["qkv"], w["n1"], EPS, state[1], pdl=pdl, prefetch=prefetch)
        o, _ = linear(qkv[:, :Q], w["o"], pdl=pdl, prefetch=prefetch)
        h, res2 = linear(o, w["gu"], w["n2"], EPS, res1, silu=True, pdl=pdl, prefetch=prefetch)
        y, _ = linear(h, w["down"], pdl=pdl, prefetch=prefetch)
        assert res2 is not None
        state[0], state[1] = y, res2

    def layer_split(state: list[torch.Tensor], w: dict, pdl: bool) -> None:
        x, res = state  # res is updated in place, as in the model
        h = rmsnorm_pdl(x, w["n1"], res, pdl)
        qkv, _ = linear(h, w["qkv"], pdl=pdl)
        o, _ = linear(qkv[:, :Q], w["o"], pdl=pdl)
        h = rmsnorm_pdl(o, w["n2"], res, pdl)
        state[0], _ = linear(silu_pdl(linear(h, w["gu"], pdl=pdl)[0], pdl), w["down"], pdl=pdl)

    variants = {
        "cublas": layer_cublas,
        "cublas-pdl": layer_cublas_pdl,
        "cublas-again": layer_cublas,  # the first variant's spread
        "split": lambda s, w: layer_split(s, w, False),
        "split-pdl": lambda s, w: layer_split(s, w, True),
        "triton": lambda s, w: layer_triton(s, w, False, False),
        "triton-pdl": lambda s, w: layer_triton(s, w, True, True),
        "triton-pdl-noprefetch": lambda s, w: layer_triton(s, w, True, False),
    }
    rows = []
    for m in [int(v) for v in args.ms.split(",")]:
        x0, r0 = rnd(m, HIDDEN, scale=1.0), rnd(m, HIDDEN, scale=1.0)
        # correctness: the whole 28-layer chain, each variant against today's kernels
        outs = {}
        for name, fn in variants.items():
            state = [x0.clone(), r0.clone()]
            for w in layers:
                fn(state, w)
            outs[name] = state[0].float()
        ref = outs["cublas"]
        err = {n: ((o - ref).norm() / ref.norm()).item() for n, o in outs.items()}
        # the same chain replayed from a CUDA graph (PDL edges are graph edges there)
        for name, fn in variants.items():
            xs, rs = x0.clone(), r0.clone()
            state = [xs, rs]
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for w in layers:
                    fn(state, w)
            xs.copy_(x0)
            rs.copy_(r0)
            g.replay()
            torch.cuda.synchronize()
            err[name + "@graph"] = ((state[0].float() - ref).norm() / ref.norm()).item()
        us = {}
        for name, fn in variants.items():
            state = [x0.clone(), r0.clone()]
            us[name] = graph_us(lambda i, fn=fn, state=state: fn(state, layers[i % LAYERS]), LAYERS)
        rows.append(dict(m=m, us_per_layer=us, rel_err_vs_cublas=err))
        print(
            f"M={m:<4}"
            + "".join(f"{n:>24}{v:7.1f}us" for n, v in us.items())
            + "   err "
            + " ".join(f"{v:.1e}" for v in err.values()),
            flush=True,
        )
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
