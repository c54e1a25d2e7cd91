"""CUDA graphs for decode: captured once at start-up for a ladder of padded batch sizes, replayed per step."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.gc_heap import paused_collector
from kernels.attention import AttnMeta

if TYPE_CHECKING:
    from engine.runner import KVLayout, ModelRunner
    from engine.scheduler import Batch
    from kernels.attention.flashinfer_backend import FlashInferBackend


def timed_capture(capture: Callable[[], None]) -> float:
    """Run a capture under inference mode, with no cyclic collection; returns its seconds, until the GPU is done.
    A collection inside a capture could free another engine's graphs (one dropped without shutdown(), in a
    reference cycle), and destroying a graph is not permitted while a stream captures: the capture failed
    (CUBLAS_STATUS_EXECUTION_FAILED, then "operation not permitted when stream is capturing"; H200)."""
    t0 = time.perf_counter()
    with torch.inference_mode(), paused_collector():
        capture()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def batch_sizes(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_bs + 1, 16))
    return sorted({s for s in sizes if s < max_bs} | {max_bs})


class DecodeGraphs:
    def __init__(self, runner: ModelRunner, max_bs: int, max_request_tokens: int):
        from kernels.attention.flashinfer_backend import FlashInferBackend

        # The graphs keep what they replay (model, token table), not the runner: the runner holds them, and that
        # cycle left a dropped engine (no shutdown()) with its KV pool and graphs until the collector came.
        self.model = runner.model
        self.next_tokens = runner.next_tokens
        # Only the decode backend is captured and replayed (under `fa,flashinfer` prefill runs on another one).
        decode = runner.backend.decode_backend()
        self.backend: FlashInferBackend | None = decode if isinstance(decode, FlashInferBackend) else None
        self.enabled = self.backend is not None
        self.sizes = batch_sizes(max_bs)
        self.max_bs = max_bs
        self.capture_seconds = 0.0
        if not self.enabled:  # torch's gathers have data-dependent shapes; FA4 decode is not captured (fa_backend.py)
            return
        dev = runner.device
        pool = runner.pool
        self.scratch_page = runner.scratch_page
        self.page_size = pool.page_size
        # Page ids a replayed batch may list: requests that share a cached prefix each list its pages, so the
        # pool's size is no bound; one request spans at most max_request_tokens (a padded row, one page).
        self.max_pages = max_bs * max(1, -(-max_request_tokens // pool.page_size))
        # The graphs' inputs, one block filled by one host-to-device copy per step: each row's request slot (the
        # graph reads its last token from the runner's token table), position, and KV slot for the new token.
        # Separate copies and the gather outside the graph were ~10 operations between steps (issue #17).
        self.inputs = torch.zeros(3, max_bs, dtype=torch.int64, device=dev)
        self.req_slots, self.pos, self.out_slots = self.inputs
        # Per size, one graph per copy of the backend's wrappers and split-KV choice (see flashinfer_backend.py).
        self.graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int, bool], torch.Tensor] = {}
        self.capture_seconds = timed_capture(self._capture)

    def _capture(self) -> None:
        backend = self.backend
        assert backend is not None
        mempool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.sizes):
            for turn in (0, 1):
                for split in backend.graph_splits(bs):
                    key = self._plan(bs, [1] * bs, [[self.scratch_page]] * bs, turn, split)
                    for _ in range(2):  # warm up (JIT, allocator) outside the graph
                        self._forward(bs)
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=mempool):
                        self.outputs[key] = self._forward(bs)
                    self.graphs[key] = g

    def _forward(self, bs: int) -> torch.Tensor:
        ids = self.next_tokens[self.req_slots[:bs]]  # the gather runs inside the graph
        hidden: torch.Tensor = self.model(ids, self.pos[:bs], self.backend)
        return hidden

    def _plan(
        self,
        bs: int,
        kv_lens: list[int],
        tables: list[list[int]],
        turn: int | None = None,
        split: bool | None = None,
    ) -> tuple[int, int, bool]:
        """Plan the batch; returns the key of the graph to replay."""
        meta = AttnMeta(True, [1] * bs, kv_lens, tables, self.out_slots[:bs])
        assert self.backend is not None  # graphs are enabled for FlashInfer decode only (__init__)
        return (bs, *self.backend.plan_graph(bs, self.max_pages, meta, self.out_slots[:bs], turn, split))

    def release(self) -> None:
        """Destroy the captured graphs now, not whenever the garbage collector gets to them."""
        if not self.enabled:
            return
        torch.cuda.synchronize()
        for g in self.graphs.values():
            g.reset()
        self.graphs.clear()
        self.outputs.clear()

    def can_run(self, batch: Batch) -> bool:
        """A decode batch of at most max_bs rows, unless its attention needs a fixed split (flashinfer_backend.
        fixed_split_pages), which FlashInfer plans only eagerly."""
        if not (self.enabled and batch.is_decode and len(batch.reqs) <= self.max_bs):
            return False
        assert self.backend is not None
        return not self.backend.fixed_split([s + 1 for s in batch.starts])

    def run(self, batch: Batch, layout: KVLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the graph for this decode batch, whose KV `layout` is the runner's; returns its hidden states and
        the rows' request slots (device)."""
        kv_lens, tables, out_slots = layout
        n = len(kv_lens)
        bs = next(s for s in self.sizes if s >= n)
        # Padded rows read slot 0's token and attend to, and write into, the scratch page that no request owns.
        host = np.zeros((3, self.max_bs), dtype=np.int64)
        host[0, :n] = [r.slot for r in batch.reqs]
        host[1, :n] = batch.starts
        host[2, :n] = out_slots
        host[2, n:bs] = self.scratch_page * self.page_size
        self.inputs.copy_(torch.from_numpy(host), non_blocking=True)  # pageable: staged at once, safe to drop
        pad = bs - n
        key = self._plan(bs, kv_lens + [1] * pad, tables + [[self.scratch_page]] * pad)
        self.graphs[key].replay()
        return self.outputs[key][:n], self.req_slots[:n]
