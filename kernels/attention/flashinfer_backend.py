"""FlashInfer paged attention (CUDA): one plan per batch, shared by all layers.

Decode uses the tensor-core decode kernel (built from the same fa2 template as the prefill wrapper, so one JIT
compile serves both). Measured on an H200 with Qwen3-0.6B shapes at 256 requests it took 156 us per layer
against 173 us for the CUDA-core decode kernel, about 3.8 TB/s of KV read (docs/gpu.md). CUDA-graph decode gets
one wrapper per captured batch size and split-KV choice (decode_split_kv) with fixed metadata buffers, re-planned
before each replay.

Prefill and mixed batches (without a sliding window) attend in up to three parts, in the order the scheduler lays
the batch out (`batch_parts`):
- the leading decode rows through the decode kernel, as in a decode step, where each KV head serves 4 query heads or
  more (SPLIT_MIN_GROUP); with fewer they join the paged part;
- requests with KV from before this step (a prompt's later chunks, a cached prefix) through the paged prefill kernel:
  FlashInfer's fa3 (Hopper) build when every request in the part brings at least CHUNK_FA3_MIN_TOKENS new tokens,
  its fa2 build otherwise (fa3 took 2-5x as long with decode rows in the pass, and lost with 16-token chunks);
- the trailing run of fresh prompts, whose keys are all new, through FlashInfer's fa3 ragged kernel, which reads K/V
  straight from the projection's output.
Measured on H100s (benchmarks/mixed_attention.py; docs/scheduling.md): the ragged part takes 118 us per layer for
8192 fresh tokens of the offline workload against 179 us paged. A 1,024-token chunk after a 10,000-token prefix beside
130 decode rows takes 366 us in three parts against 738 us in one fa2 pass at one Qwen3-32B TP=4 rank's heads (16
query, 2 KV), and Qwen3-32B's replay at TP=4 gained (TBT p99 78 -> 60 ms). At Llama-3.1-8B's heads (32, 8) it took
1,003 against 1,313 us after a 10,000-token prefix, and its replay on one H100 gained (TBT p99 53.5 against 70.5-71.7
ms, output 1.06x). At Qwen3-0.6B's heads (16, 8) the same batch took 1,216 against 1,297 us, but the extra kernel
calls cost each mixed step 2.8 ms more host time, and its saturated replay lost at TBT p99 (52.6 against 40.7 ms):
there the decode rows stay in the paged pass (over a bf16 pool; over fp8, below, they go apart at any group).

Over a bf16 / fp16 pool on Hopper (head dim 128, pages of 16, 2 query heads per KV head), decode rows go through this
project's CUDA kernel (kernels/attention/cuda_decode.py, behind the same plan/run calls: span_decode.py), built at the
backend's start when the engine names a kernel cache: on an H200 0.7-8% faster than FlashInfer's tensor-core decode
from 16 to 256 rows.
It splits the requests' keys into spans of one length only where one CTA per (request, KV head) leaves the GPU half
empty or one request is far longer than the rest (cuda_decode_split).

Over an fp8 pool on Hopper, decode rows go through this project's Triton kernel instead (kernels/attention/
fp8_decode.py, behind the same plan/run calls: span_decode.py): FlashInfer's widens fp8 K/V through shared memory
and was no faster than bf16 on an H200. Its split cuts every request into spans of one length (span_decode_work), so a
long context beside short ones is shared out among the GPU's programs (H200: 655 -> 78 us per layer for a 32,768-token
request beside seven short ones).

A decode batch that fills the GPU with one request far longer than the rest gets a fixed split of each request's KV
(fixed_split_pages): FlashInfer splits only to fill the GPU, so that request's CTAs would read on alone. FlashInfer
plans a fixed split only eagerly, so such a batch runs from the piecewise graphs, not a decode graph (engine/runner.py).

Every wrapper comes in two copies used in turn. A plan writes its schedule into the wrapper's pinned host
buffer and queues an async copy to the device; under overlap scheduling the next plan runs while the previous
step may not have started, so reusing one wrapper would overwrite a schedule before the GPU has read it.
"""

from __future__ import annotations

import sys
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from kernels.attention import cuda_decode
from kernels.attention.base import AttentionBackend, AttnMeta
from kernels.attention.span_decode import (
    FP8_PROGRAMS_PER_SM,
    SpanDecodeWrapper,
    SpanScratch,
    fp8_decode_supported,
    span_length,
)
from kvcache.pool import KVPool

WORKSPACE_BYTES = 256 * 2**20
# FlashInfer's own kernel family for each wrapper ("fa2" | "fa3" on sm90): fa2 for both, one JIT build; the step
# profile's variants switch them for an A/B (benchmarks/step_profile.py).
PREFILL_KERNELS = "fa2"
DECODE_KERNELS = "fa2"
RAGGED_KERNELS = "fa3"  # the fresh prompts' part of a prefill (one JIT build of its own)
CHUNK_KERNELS = "fa3"  # the paged part when each of its requests brings CHUNK_FA3_MIN_TOKENS or more
CHUNK_FA3_MIN_TOKENS = 128
# Fresh prompts through the ragged kernel; off: they join the paged part.
RAGGED_PREFILL = True
# A mixed batch's decode rows through the decode kernel when each KV head serves SPLIT_MIN_GROUP query heads or more;
# off: they join the paged part.
SPLIT_DECODE_ROWS = True
SPLIT_MIN_GROUP = 4
# Decode without split-KV where it is the faster choice (decode_split_kv, below); off: FlashInfer's own
# choice, which in CUDA-graph mode is always to split (benchmarks/step_profile.py's `split-always` variant).
NO_SPLIT_WHEN_BALANCED = True
# Decode over an fp8 pool through kernels/attention/fp8_decode.py where it runs (fp8_decode_supported); off: FlashInfer.
TRITON_FP8_DECODE = True
# Decode over a 16-bit pool through kernels/attention/cuda_decode.py where it runs (cuda_decode.supported, and the
# engine passed a kernel cache to build it in); off (or MINISGL_CUDA_DECODE=0): FlashInfer.
CUDA_DECODE = True
# Programs per SM the CUDA decode's spans aim for when a batch splits (span_decode_work); its CTA of 8 warps takes
# 131 KB of shared memory, one per SM at once.
CUDA_PROGRAMS_PER_SM = 2
# A decode batch that fills the GPU (fixed_split_pages) with one request far longer than the rest runs FlashInfer with
# each request's KV cut into chunks of this many pages, eagerly (FlashInfer refuses a fixed split in CUDA-graph mode);
# 0: FlashInfer's own choice (benchmarks/decode_attention_kernels.py's fi-tc-graph against fi-tc-split32).
FIXED_SPLIT_PAGES = 32
# "Far longer": its KV over FIXED_SPLIT_MARGIN times one slot's share of the batch's. The batches measured were 3.4x
# (255 rows beside a 32k context) and 10x (63 rows); the offline workload's own, at most 1.27x (its decode steps of 33+
# rows, from the draw), keep their decode graphs (a fixed split there is unmeasured end to end).
FIXED_SPLIT_MARGIN = 3


def paged_metadata(meta: AttnMeta, page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CSR page table for FlashInfer: indptr and last_page_len on the CPU (its planner reads them there),
    indices already on the device: FlashInfer copies host indices with a blocking copy, which would
    stall overlap scheduling."""
    counts = [len(t) for t in meta.page_tables]
    indptr = torch.zeros(len(counts) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(counts, dtype=torch.int32).cumsum(0)
    # np.fromiter: 0.8 ms for 35k page ids on the 2-core CPU machine, against 3.2 ms for torch.tensor(list(...)).
    total = int(indptr[-1])
    indices = torch.from_numpy(np.fromiter(chain.from_iterable(meta.page_tables), dtype=np.int32, count=total))
    indices = indices.to(meta.out_slots.device, non_blocking=True)
    last = torch.tensor([(kv - 1) % page_size + 1 for kv in meta.kv_lens], dtype=torch.int32)
    return indptr, indices, last


def decode_split_kv(kv_lens: list[int], num_kv_heads: int, slots: int) -> bool:
    """Whether a decode batch splits each request's KV over several CTAs and merges the parts in a second kernel.
    Without the split each CTA reads one (request, KV head) whole, which is faster once the batch has enough of them
    to fill the GPU's `slots` and no request is longer than one slot's share of all the KV (H100, offline workload:
    decode steps of 129-256 rows 2-4% faster, docs/gpu.md); a lone long request would keep one CTA busy while the
    rest idle. FlashInfer splits by itself when it sees fit; in CUDA-graph mode it always splits."""
    return max(kv_lens) * slots > sum(kv_lens) * num_kv_heads


def cuda_decode_split(kv_lens: list[int], num_kv_heads: int, sms: int, slots: int) -> bool:
    """Whether the CUDA decode (kernels/attention/cuda_decode.py) cuts this decode batch's requests into spans. Its CTA
    of 8 warps takes an SM alone, and one per (request, KV head) was the faster plan while they fill at least half the
    SMs: on an H200 at the offline workload's lengths (Qwen3-0.6B's 8 KV heads) 23.9 against 26.0 us at 16 rows, 41.9
    against 44.1 at 32; at 8 rows, 64 CTAs, 20.8 against 15.4 (docs/gpu.md, fifty-sixth session). A request far
    longer than the rest splits as FlashInfer's fixed split does (far_longer, `slots` as there)."""
    return 2 * len(kv_lens) * num_kv_heads <= sms or far_longer(kv_lens, num_kv_heads, slots)


def far_longer(kv_lens: list[int], num_kv_heads: int, slots: int) -> bool:
    """Whether one request's KV is over FIXED_SPLIT_MARGIN times one slot's share of the batch's."""
    return max(kv_lens) * slots > FIXED_SPLIT_MARGIN * sum(kv_lens) * num_kv_heads


def fixed_split_pages(kv_lens: list[int], num_kv_heads: int, slots: int) -> int:
    """The pages per chunk of a fixed split for this decode batch, or 0 for FlashInfer's own choice. FlashInfer splits
    a request's KV only to fill the GPU: a batch of at least `slots` (request, KV head) CTAs runs unsplit, and one
    request far longer than a slot's share of the KV (FIXED_SPLIT_MARGIN times) keeps its CTAs reading long after the
    rest are done. Cut into chunks of FIXED_SPLIT_PAGES, 255 rows of the offline workload's lengths beside one of 32,768
    tokens took 328 against 658 us per layer (H200, Qwen3-0.6B's heads; FlashInfer's CUDA-graph decode, which the
    engine replays, took 658, its eager choice 651); 64 such rows 116 against 481 (docs/gpu.md)."""
    if FIXED_SPLIT_PAGES <= 0 or len(kv_lens) * num_kv_heads < slots:
        return 0
    return FIXED_SPLIT_PAGES if far_longer(kv_lens, num_kv_heads, slots) else 0


def fresh_tail(meta: AttnMeta) -> int:
    """Where the batch's trailing run of requests without KV before this step starts (len(q_lens): none). The
    scheduler puts decode rows first, then prompts being chunked, then the prompts it admits now."""
    at = len(meta.q_lens)
    while at and meta.kv_lens[at - 1] == meta.q_lens[at - 1]:
        at -= 1
    return at


def leading_decode_rows(meta: AttnMeta) -> int:
    """How many requests at the batch's start bring one token after KV of their own: the running requests' decode
    rows, which the scheduler puts first."""
    n = 0
    while n < len(meta.q_lens) and meta.q_lens[n] == 1 and meta.kv_lens[n] > 1:
        n += 1
    return n


def batch_parts(meta: AttnMeta, ragged: bool, split_decode: bool) -> list[tuple[str, int, int]]:
    """A prefill or mixed batch cut into (kind, first request, end request) runs: "decode" (the leading decode rows),
    "paged" (requests with KV before this step) and "ragged" (the trailing fresh prompts); empty runs left out."""
    n = len(meta.q_lens)
    lead = leading_decode_rows(meta) if split_decode else 0
    tail = fresh_tail(meta) if ragged else n  # never inside the decode rows: they have KV of their own
    runs = [("decode", 0, lead), ("paged", lead, tail), ("ragged", tail, n)]
    return [r for r in runs if r[2] > r[1]]


def _sub(meta: AttnMeta, reqs: slice, is_decode: bool | None = None) -> AttnMeta:
    decode = meta.is_decode if is_decode is None else is_decode
    return AttnMeta(decode, meta.q_lens[reqs], meta.kv_lens[reqs], meta.page_tables[reqs], meta.out_slots)


def _indptr(lens: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
    return out


class _Wrapper(Protocol):
    """The calls made on a FlashInfer wrapper (flashinfer ships no type information)."""

    def plan(self, *args: Any, **kwargs: Any) -> None: ...
    def run(self, q: torch.Tensor, *args: Any, **kwargs: Any) -> Any: ...


class FlashInferBackend(AttentionBackend):
    def __init__(
        self,
        pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device,
        sliding_window: int | None = None,
        kernel_cache: Path | None = None,  # where the CUDA decode is built; None: FlashInfer's decode over 16 bits
    ):
        super().__init__(pool, num_heads, num_kv_heads, head_dim, sliding_window)
        # FlashInfer's window_left counts the keys left of the query's own: W visible positions is W - 1. It is a plan
        # argument (the kernel variant with the window is its own JIT build), so CUDA-graph replays keep it.
        self.window_left = -1 if sliding_window is None else sliding_window - 1
        import flashinfer

        self.fi = flashinfer
        self.device = device
        self.dtype, self.kv_dtype = pool.compute_dtype, pool.dtype
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.use_tensor_cores = True
        self.prefill = [
            flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=PREFILL_KERNELS)
            for _ in range(2)
        ]
        self.chunks = [
            flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=CHUNK_KERNELS)
            for _ in range(2)
        ]
        self.ragged = [
            flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend=RAGGED_KERNELS)
            for _ in range(2)
        ]
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count
        # Enough CTAs to fill the GPU: a no-split decode runs one CTA per (request, KV head), about two per SM.
        self.split_slots = 2 * self.sms
        self.fp8_decode = (
            TRITON_FP8_DECODE and pool.quantized and fp8_decode_supported(device, head_dim, sliding_window)
        )
        self.cuda_decode = (
            CUDA_DECODE
            and kernel_cache is not None
            and not pool.quantized
            and cuda_decode.enabled()
            and cuda_decode.supported(
                device, num_heads, num_kv_heads, head_dim, pool.page_size, pool.dtype, sliding_window
            )
            and _cuda_decode_built(kernel_cache, device)
        )
        # the decode through span_decode.SpanDecodeWrapper: one of the project's own kernels
        self.span_kernel = "fp8" if self.fp8_decode else "cuda" if self.cuda_decode else None
        self.span_scratch = SpanScratch(device)
        self.span_slots = (FP8_PROGRAMS_PER_SM if self.fp8_decode else CUDA_PROGRAMS_PER_SM) * self.sms
        self.decode: list[_Wrapper] = [self._decode_wrapper() for _ in range(2)]
        self.graph_wrappers: dict[tuple[int, int, bool], _Wrapper] = {}
        self.graph_indices: dict[int, torch.Tensor] = {}  # per copy: one page-id buffer for every batch size
        self.turn = 0  # which copy the next plan uses
        self.active: _Wrapper = self.decode[0]
        # A prefill or mixed batch in parts: (wrapper, first token row, end row, ragged); None: `active` alone.
        self.parts: list[tuple[_Wrapper, int, int, bool]] | None = None

    def _decode_wrapper(self) -> _Wrapper:
        """An eager decode wrapper: the project's own kernel's (fp8 or CUDA) or FlashInfer's."""
        if self.span_kernel is not None:
            return SpanDecodeWrapper(self.span_slots, self.span_scratch, kernel=self.span_kernel)
        eager: _Wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.use_tensor_cores, backend=DECODE_KERNELS
        )
        return eager

    def split_kv(self, kv_lens: list[int]) -> bool:
        if not NO_SPLIT_WHEN_BALANCED:
            return True
        if self.fp8_decode:  # whether its spans cut some request: else the plan without the merge
            programs = -(-self.span_slots // self.num_kv_heads)
            return max(kv_lens) > span_length(np.asarray(kv_lens), programs, SpanDecodeWrapper.MAX_SPANS)
        if self.cuda_decode:
            return cuda_decode_split(kv_lens, self.num_kv_heads, self.sms, self.split_slots)
        return decode_split_kv(kv_lens, self.num_kv_heads, self.split_slots)

    def fixed_split(self, kv_lens: list[int]) -> int:
        """fixed_split_pages for a decode batch here (0 for the project's own kernels, whose spans share out long
        requests, and with a sliding window); such a batch runs eagerly, not from a CUDA graph."""
        if self.span_kernel is not None or self.window_left >= 0:
            return 0
        return fixed_split_pages(kv_lens, self.num_kv_heads, self.split_slots)

    def _plan(self, wrapper: _Wrapper, meta: AttnMeta, split: bool = True) -> None:
        indptr, indices, last = paged_metadata(meta, self.pool.page_size)
        common = dict(
            q_data_type=self.dtype, kv_data_type=self.kv_dtype, sm_scale=self.scale, window_left=self.window_left
        )
        paged = (indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim, self.pool.page_size)
        fixed = self.fixed_split(meta.kv_lens) if meta.is_decode and wrapper in self.decode else 0
        if fixed:
            wrapper.plan(*paged, fixed_split_size=fixed, **common)
        elif meta.is_decode:
            wrapper.plan(*paged, disable_split_kv=not split, **common)
        else:
            wrapper.plan(_indptr(meta.q_lens), *paged, causal=True, **common)
        self.active, self.out_slots, self.parts = wrapper, meta.out_slots, None

    def _plan_parts(self, turn: int, meta: AttnMeta) -> None:
        windowed = self.window_left >= 0  # the windowed kernels are fa2's paged ones alone
        # over an fp8 pool at any group: FlashInfer's paged pass widens the decode rows' fp8 KV as its decode does
        split = SPLIT_DECODE_ROWS and (self.fp8_decode or self.num_heads >= SPLIT_MIN_GROUP * self.num_kv_heads)
        runs = batch_parts(meta, RAGGED_PREFILL and not windowed, split and not windowed)
        parts, row = [], 0
        for kind, a, b in runs:
            sub = _sub(meta, slice(a, b), is_decode=kind == "decode")
            if kind == "decode":
                wrapper = self.decode[turn]
                self._plan(wrapper, sub, self.split_kv(sub.kv_lens))
            elif kind == "paged":
                # FlashInfer's fa3 paged kernel takes fp8 K/V only with an fp8 query
                long = not windowed and not self.pool.quantized and min(sub.q_lens) >= CHUNK_FA3_MIN_TOKENS
                wrapper = self.chunks[turn] if long else self.prefill[turn]
                self._plan(wrapper, sub)
            else:
                wrapper = self.ragged[turn]
                qo = _indptr(sub.q_lens)
                common = dict(q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.scale)
                wrapper.plan(qo, qo, self.num_heads, self.num_kv_heads, self.head_dim, causal=True, **common)
            end = row + sum(sub.q_lens)
            parts.append((wrapper, row, end, kind == "ragged"))
            row = end
        self.out_slots = meta.out_slots
        # one paged part: `active` (its _plan set it) alone
        self.parts = None if len(parts) == 1 and not parts[0][3] else parts

    def _next_turn(self) -> int:
        turn, self.turn = self.turn, self.turn ^ 1
        return turn

    def plan(self, meta: AttnMeta) -> None:
        turn = self._next_turn()
        if meta.is_decode:
            self._plan(self.decode[turn], meta, self.split_kv(meta.kv_lens))
        else:
            self._plan_parts(turn, meta)

    # ---- CUDA graphs --------------------------------------------------------------------------------
    def graph_splits(self, bs: int) -> tuple[bool, ...]:
        """The split_kv choices a decode graph of `bs` rows is captured for, each with its own wrapper and graph: with
        a split the graph holds the merge kernel, and FlashInfer's plan lays out its int workspace differently (the
        merge index before the block mask). Below split_slots / KV heads rows every batch splits (FlashInfer's rule),
        at most half the SMs' CTAs with the CUDA decode (cuda_decode_split)."""
        ctas = bs * self.num_kv_heads
        fills = 2 * ctas > self.sms if self.cuda_decode else ctas >= self.split_slots
        return (True, False) if NO_SPLIT_WHEN_BALANCED and fills else (True,)

    def graph_wrapper(self, bs: int, turn: int, split: bool, max_pages: int) -> _Wrapper:
        """A decode wrapper whose metadata lives in fixed buffers, so a captured graph can replay it."""
        if (bs, turn, split) not in self.graph_wrappers:
            # Batch sizes share a copy's page-id buffer: only the graph replayed next reads it, and each plan
            # refills it with a copy queued on the stream behind the replays before it.
            if turn not in self.graph_indices or self.graph_indices[turn].numel() < max_pages:
                self.graph_indices[turn] = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
            if self.span_kernel is not None:
                wrapper: _Wrapper = SpanDecodeWrapper(
                    self.span_slots, self.span_scratch, self.graph_indices[turn], bs, kernel=self.span_kernel
                )
            else:
                indptr, last = (torch.zeros(n, dtype=torch.int32, device=self.device) for n in (bs + 1, bs))
                wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace,
                    "NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=self.use_tensor_cores,
                    backend=DECODE_KERNELS,
                    paged_kv_indptr_buffer=indptr,
                    paged_kv_indices_buffer=self.graph_indices[turn],
                    paged_kv_last_page_len_buffer=last,
                )
            self.graph_wrappers[bs, turn, split] = wrapper
        return self.graph_wrappers[bs, turn, split]

    def plan_graph(
        self,
        bs: int,
        max_pages: int,
        meta: AttnMeta,
        out_slots: torch.Tensor,
        turn: int | None = None,
        split: bool | None = None,
    ) -> tuple[int, bool]:
        """Plan the graph wrapper for this batch size; returns which graph must be replayed: (copy, split_kv)."""
        turn = self._next_turn() if turn is None else turn
        if split is None:
            split = self.split_kv(meta.kv_lens) or False not in self.graph_splits(bs)
        self._plan(self.graph_wrapper(bs, turn, split, max_pages), meta, split)
        self.out_slots = out_slots
        return turn, split

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        stored: bool = False,
        out: torch.Tensor | None = None,  # where to write the result (piecewise graphs read it there)
    ) -> torch.Tensor:
        assert self.out_slots is not None
        if k is not None and v is not None and not stored:
            self.pool.store(layer, self.out_slots, k, v)
        cache = (self.pool.k[layer], self.pool.v[layer])
        if self.parts is None:
            result: torch.Tensor = self.active.run(q, cache, out=out)
            return result
        out = torch.empty_like(q) if out is None else out
        for wrapper, a, b, ragged in self.parts:
            if not ragged:
                wrapper.run(q[a:b], cache, out=out[a:b])
                continue
            if k is None or v is None or self.pool.quantized:
                # not passed (stored by the caller), or stored in fp8, which every other read sees: read them back
                ks, vs = self.pool.gather(layer, self.out_slots[a:b])
                wrapper.run(q[a:b], ks, vs, out=out[a:b])
            else:
                wrapper.run(q[a:b], k[a:b], v[a:b], out=out[a:b])
        return out


_cuda_decode_refused: set[str] = set()


def _cuda_decode_built(cache: Path, device: torch.device) -> bool:
    """cuda_decode.load; why it cannot be built is said once per process (FlashInfer's decode runs instead)."""
    why = cuda_decode.load(cache, device)
    if why is not None and why not in _cuda_decode_refused:
        _cuda_decode_refused.add(why)
        print(f"minisgl: FlashInfer's decode attention (the CUDA decode cannot be built: {why[:300]})", file=sys.stderr)
    return why is None
