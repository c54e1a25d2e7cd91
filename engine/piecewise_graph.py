"""CUDA graphs for prefill and mixed steps, in pieces: the layers' work between two attention calls (norms, GEMMs, the
fused q/k/rope/KV store, the MLP) is captured at start-up for a ladder of padded token counts, and attention runs
eagerly between the pieces on the batch's own FlashInfer plan, whose shapes no fixed graph could hold.

Why: launched eagerly, a prefill or mixed step costs the host ~50 us per kernel, 8-13 ms for Qwen3-0.6B's 28
layers, against 3-5 ms of GPU work for a step of a few hundred tokens (docs/scheduling.md), so below saturation
those steps are host-bound and every running stream waits on them. vLLM and SGLang capture the same pieces.

Padded tokens (from the batch's T up to the piece's size) read stale token ids and positions, write their K/V into
the scratch page no request owns, and leave rows that nothing reads; attention sees only the T real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.cuda_graph import timed_capture
from kernels.attention import AttnMeta

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

    from engine.runner import ModelRunner
    from kernels.attention.flashinfer_backend import FlashInferBackend
    from kvcache.pool import KVPool


def token_sizes(max_tokens: int) -> list[int]:
    """The padded token counts captured: powers of two to 256, then four steps per doubling (at most 25% padding),
    and max_tokens itself."""
    sizes = [16, 32, 64, 128]
    s = 256
    while s < max_tokens:
        sizes += [s, s * 5 // 4, s * 3 // 2, s * 7 // 4]
        s *= 2
    return sorted({x for x in sizes if x < max_tokens} | {max_tokens})


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A view of t's memory that does not keep it allocated. The piece after an attention call may reuse the memory
    of that call's q/k/v (they are dead once attention has read them); replays run in capture order, so it is only
    written after the eager attention between the two pieces has read it."""
    storage = t.untyped_storage()
    weak = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(weak, t.storage_offset(), t.shape, t.stride())


@dataclass(slots=True)
class _Call:
    """One attention call between two pieces, on the pieces' memory."""

    layer: int
    q: torch.Tensor
    k: torch.Tensor | None
    v: torch.Tensor | None
    stored: bool


class _Splitter:
    """Stands in for the attention backend while the model runs to be captured: each attention call ends the piece
    being captured, is recorded, and starts the next piece; it returns the shared output buffer, which the eager
    attention fills at replay. With `mempool` None (warm-up) nothing is captured."""

    def __init__(self, pool: KVPool, out_slots: torch.Tensor, out: torch.Tensor, mempool: _POOL_HANDLE | None):
        self.pool, self.out_slots, self.out, self.mempool = pool, out_slots, out, mempool
        self.pieces: list[torch.cuda.CUDAGraph] = []
        self.calls: list[_Call] = []
        if mempool is not None:
            self._begin()

    def _begin(self) -> None:
        g = torch.cuda.CUDAGraph()
        g.capture_begin(pool=self.mempool)
        self.pieces.append(g)

    def end(self) -> None:
        if self.mempool is not None:
            self.pieces[-1].capture_end()

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, stored: bool = False
    ) -> torch.Tensor:
        if self.mempool is not None:
            self.end()
            alias = [None if t is None else _alias(t) for t in (q, k, v)]
            assert alias[0] is not None
            self.calls.append(_Call(layer, alias[0], alias[1], alias[2], stored))
            self._begin()
        return self.out[: q.shape[0]]


@dataclass(slots=True)
class _Captured:
    pieces: list[torch.cuda.CUDAGraph]  # len(calls) + 1
    calls: list[_Call]
    hidden: torch.Tensor  # the last piece's output [size, hidden]


class MixedGraphs:
    """Piecewise graphs for batches of up to `max_tokens` tokens on the FlashInfer backend: prefill and mixed steps,
    and the decode steps the decode graphs do not run (more rows than captured; a fixed split of a long request's KV,
    flashinfer_backend.fixed_split_pages)."""

    def __init__(self, runner: ModelRunner, max_tokens: int):
        from kernels.attention.flashinfer_backend import FlashInferBackend

        self.model, self.pool = runner.model, runner.pool  # not the runner, which holds this (cuda_graph.py)
        be = runner.backend
        self.backend: FlashInferBackend | None = be if isinstance(be, FlashInferBackend) else None
        self.enabled = self.backend is not None and max_tokens > 0 and runner.scratch_page >= 0
        self.sizes = token_sizes(max_tokens) if max_tokens > 0 else []
        self.max_tokens = max_tokens
        self.capture_seconds = 0.0
        self.captured: dict[int, _Captured] = {}
        if not self.enabled:
            return
        assert self.backend is not None
        dev, pool = runner.device, runner.pool
        self.scratch_slot = runner.scratch_page * pool.page_size
        self.ids = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self.slots = torch.full((max_tokens,), self.scratch_slot, dtype=torch.int64, device=dev)
        # Every layer's attention output, read by the next piece's o_proj: zeros, so padded rows stay finite.
        be = self.backend
        self.out = torch.zeros(max_tokens, be.num_heads, be.head_dim, dtype=pool.compute_dtype, device=dev)
        self.capture_seconds = timed_capture(self._capture)

    def _capture(self) -> None:
        model, pool = self.model, self.pool
        mempool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch ships Stream() untyped
        for n in reversed(self.sizes):
            args = (self.ids[:n], self.pos[:n])
            for _ in range(2):  # warm up (cuBLAS workspaces, Triton, the allocator) outside the graph
                model(*args, _Splitter(pool, self.slots[:n], self.out, None))
            torch.cuda.synchronize()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                splitter = _Splitter(pool, self.slots[:n], self.out, mempool)
                hidden = model(*args, splitter)
                splitter.end()
            torch.cuda.current_stream().wait_stream(stream)
            self.captured[n] = _Captured(splitter.pieces, splitter.calls, hidden)

    def release(self) -> None:
        if not self.captured:
            return
        torch.cuda.synchronize()
        for c in self.captured.values():
            for g in c.pieces:
                g.reset()
        self.captured.clear()

    def can_run(self, num_tokens: int) -> bool:
        return self.enabled and num_tokens <= self.max_tokens

    def run(self, ids: torch.Tensor, pos: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """The model over a batch of T tokens (inputs on the device; `meta` is planned here): hidden states [T, H]."""
        assert self.backend is not None
        t = ids.shape[0]
        n = next(s for s in self.sizes if s >= t)
        self.ids[:t].copy_(ids)
        self.pos[:t].copy_(pos)
        self.slots[:t].copy_(meta.out_slots)
        if n > t:  # the tail may hold real slots from an earlier step: padded rows must write to the scratch page
            self.slots[t:n].fill_(self.scratch_slot)
        meta.out_slots = self.slots[:t]
        self.backend.plan(meta)
        c = self.captured[n]
        for piece, call in zip(c.pieces, c.calls):
            piece.replay()
            k = None if call.k is None else call.k[:t]
            v = None if call.v is None else call.v[:t]
            self.backend.forward(call.layer, call.q[:t], k, v, call.stored, out=self.out[:t])
        c.pieces[-1].replay()
        return c.hidden[:t]
