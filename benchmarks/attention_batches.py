"""Shared by the attention benchmarks (GPU): a CUDA-event timer, and a batch laid out on one layer's paged pool."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from statistics import median
from typing import Any

import torch

from kernels.attention.base import AttnMeta
from kvcache.pool import KVPool


def timed(fn: Callable[[], object]) -> float:
    """Median microseconds of 20 CUDA-event timed calls, after one untimed call (a JIT build, first loads)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return median(times)


def paged_batch(
    reqs: list[tuple[int, int]], kv_heads: int, head_dim: int, page_size: int, device: torch.device
) -> tuple[KVPool, AttnMeta]:
    """A prefill or mixed batch of (q_len, kv_len) requests, in that order: one layer's bf16 pool with random K/V on
    scattered pages (page 0 unused), each request's pages in its table, its new tokens' slots in out_slots."""
    q_lens, kv_lens = [q for q, _ in reqs], [kv for _, kv in reqs]
    pages = [-(-kv // page_size) for kv in kv_lens]
    pool = KVPool.create(1, sum(pages) + 1, page_size, kv_heads, head_dim, torch.bfloat16, device)
    pool.k[0].normal_()
    pool.v[0].normal_()
    perm = (torch.randperm(sum(pages)) + 1).tolist()
    tables, slots, at = [], [], 0
    for q_len, kv, p in zip(q_lens, kv_lens, pages):
        table = perm[at : at + p]
        at += p
        tables.append(table)
        pos = torch.arange(kv - q_len, kv)
        slots.append(torch.tensor(table)[pos // page_size] * page_size + pos % page_size)
    return pool, AttnMeta(False, q_lens, kv_lens, tables, torch.cat(slots).to(device))


def backend_timing(be: Any, meta: AttnMeta, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[dict, Any]:
    """An attention backend on one layer of `meta` (K/V already stored): {"us": forward's GPU time, "plan_ms": the
    host's plan time, median of 5}, and its output in float32."""
    plans = []
    for _ in range(5):
        t0 = time.perf_counter()
        be.plan(meta)
        plans.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    us = timed(partial(be.forward, 0, q, k, v, True))
    return {"us": us, "plan_ms": median(plans)}, be.forward(0, q, k, v, True).float()
