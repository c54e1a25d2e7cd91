"""The plan side of the project's own decode kernels, the fp8 decode (kernels/attention/fp8_decode.py, Triton) and
the bf16 CUDA decode (kernels/attention/cuda_decode.py): how a batch's requests are cut into spans, and the wrapper
that gives either kernel FlashInfer's decode-wrapper calls (plan, run), so the FlashInfer backend drives it as one of
its own. Both kernels take the same work items and share the fp8 decode's merge. No Triton or CUDA here: the plan runs
on the host, and CPU tests check it."""

from __future__ import annotations

import numpy as np
import torch

# The fp8 kernel's shapes, fixed here and read by the kernel: keys per step of its loop (64 and 256 were 10-43% slower
# on an H200, as were 8 warps), and the most spans of one request its merge takes.
KEYS_PER_STEP = 128
MERGE_SPANS = 32


def fp8_decode_supported(device: torch.device, head_dim: int, sliding_window: int | None) -> bool:
    """Where kernels/attention/fp8_decode.py runs: Hopper (fp8 MMAs measured there), head sizes 16-128 (those tested),
    no sliding window."""
    return torch.cuda.get_device_capability(device)[0] == 9 and head_dim in (16, 32, 64, 128) and sliding_window is None


# A span starts at a multiple of the fp8 kernel's keys per step (no step straddles two spans; a multiple of the CUDA
# kernel's page, too).
SPAN_ALIGN = KEYS_PER_STEP
# Programs per SM the spans aim for (span_decode_work). The kernel holds 3 per SM at once; with 2, a batch of 16-64
# rows ran its last wave nearly alone. 8 (H100, graphs): 7-20% faster at 32-64 rows, 20-32% on a batch with one long
# context, 1.7% slower at 256 rows of shared prefixes (docs/gpu.md, twenty-fifth session).
FP8_PROGRAMS_PER_SM = 8
# The CUDA decode's CTAs: a work item's KV heads in consecutive CTAs of a flat grid, so they run at once and read each
# token's heads (one contiguous run of the pool's row) together; before, a KV head's items were consecutive. One H200,
# the offline run in one process (benchmarks/results/session59/): the attention kernels 3,469-3,477 ms against
# 3,604-3,609, 26,469 / 26,626 tok/s against 25,951 / 25,920 (+2.2%). The items longest first as well lost (25,718 /
# 25,799), though a layer's call alone at the offline lengths ran faster so at 32-96 rows.
CUDA_HEADS_TOGETHER = True


def span_length(lens: np.ndarray, programs: int, max_spans: int) -> int:
    """The span length with the split (span_decode_work)."""
    span = max(-(-int(lens.sum()) // max(1, programs)), -(-int(lens.max()) // max_spans), 1)
    return -(-span // SPAN_ALIGN) * SPAN_ALIGN


def span_decode_work(lens: np.ndarray, programs: int, split: bool, max_spans: int) -> tuple[np.ndarray, np.ndarray]:
    """The decode's work items: each request's keys cut into spans of one length, so that a lone long request is
    shared out as evenly as many short ones. With `split`, the length is chosen for about `programs` spans in all (the
    GPU's programs per KV head; never more than programs + requests), at most `max_spans` per request, and aligned to
    SPAN_ALIGN; without, one span per request. Returns the items, int32 [3, items] (request, first key, end key),
    and where each request's items start, int32 [requests + 1]."""
    span = span_length(lens, programs, max_spans) if split else max(int(lens.max()), 1)
    counts = -(-lens // span)
    work_ptr = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(counts, out=work_ptr[1:])
    req = np.repeat(np.arange(len(lens), dtype=np.int32), counts)
    start = (np.arange(len(req), dtype=np.int32) - work_ptr[req]) * span
    return np.stack([req, start, np.minimum(lens[req], start + span)]).astype(np.int32), work_ptr


class SpanScratch:
    """fp32 scratch for the spans' outputs and log-sum-exps, one for every span decode wrapper of a backend: attention
    kernels run in stream order, so one buffer serves them all. It only grows, and keeps every buffer it handed out:
    a captured CUDA graph holds its address."""

    def __init__(self, device: torch.device):
        self.device = device
        self.kept: list[torch.Tensor] = []

    def get(self, numel: int) -> torch.Tensor:
        if not self.kept or self.kept[-1].numel() < numel:
            grown = max(numel, 2 * self.kept[-1].numel()) if self.kept else numel
            self.kept.append(torch.empty(grown, dtype=torch.float32, device=self.device))
        return self.kept[-1]


class SpanDecodeWrapper:
    """FlashInfer's decode-wrapper calls (plan, run) over `kernel`: "fp8" (kernels/attention/fp8_decode.py) or "cuda"
    (kernels/attention/cuda_decode.py, a bf16 / fp16 pool). Each plan cuts the batch into
    spans (span_decode_work) and sends their metadata to the device in one copy. A graph wrapper (`graph_rows` set)
    keeps it in fixed buffers sized for its batch size, the spans padded to the most a plan can make, and the page ids
    in the copy's shared buffer (`graph_indices`): each plan refills them with copies queued on the stream, behind the
    replays before it."""

    MAX_SPANS = MERGE_SPANS

    def __init__(
        self,
        slots: int,
        scratch: SpanScratch,
        graph_indices: torch.Tensor | None = None,
        graph_rows: int | None = None,
        kernel: str = "fp8",
    ):
        assert kernel in ("fp8", "cuda")
        self.slots = slots  # the programs the spans aim for (the kernel's programs per SM times the SMs)
        self.scratch = scratch
        self.kernel = kernel
        self.graph_indices, self.graph_rows = graph_indices, graph_rows
        self.graph_meta: torch.Tensor | None = None  # the graph wrapper's: indptr, work_ptr, work
        self.sm_scale = 1.0
        self.indptr = self.indices = self.work = self.work_ptr = torch.empty(0)
        self.part: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None

    def plan(
        self,
        indptr: torch.Tensor,  # host
        indices: torch.Tensor,  # device
        last_page_len: torch.Tensor,  # host
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        disable_split_kv: bool = False,
        sm_scale: float,
        **_: object,  # FlashInfer's dtypes and window: fixed for the kernel (fp8_decode_supported, cuda_decode's)
    ) -> None:
        rows = len(indptr) - 1
        ptr = indptr.numpy()
        lens = (ptr[1:] - ptr[:-1] - 1) * page_size + last_page_len.numpy()
        programs = -(-self.slots // num_kv_heads)
        work, work_ptr = span_decode_work(lens, programs, not disable_split_kv, self.MAX_SPANS)
        spans = work.shape[1]
        # Triton compiles a kernel per alignment of its pointers and per divisibility of its ints by 16, so every
        # section of the metadata starts on 16 bytes and the spans (the rows' stride) are padded to a multiple of 16
        # with request -1 (no work): otherwise a new batch shape compiled a variant mid-run (a 1 s stall in a replay).
        # A graph's are padded to the most a plan of its rows makes.
        most = spans if self.graph_rows is None else rows if disable_split_kv else rows + programs
        items, at = -(-most // 16) * 16, -(-(rows + 1) // 4) * 4
        host = np.full(2 * at + 3 * items, -1, dtype=np.int32)
        host[: rows + 1], host[at : at + rows + 1] = ptr, work_ptr
        host[2 * at :].reshape(3, items)[:, :spans] = work
        self.sm_scale = sm_scale
        if self.graph_rows is None:
            meta = torch.from_numpy(host).to(indices.device, non_blocking=True)
            self.indices = indices
        else:
            assert self.graph_indices is not None and rows == self.graph_rows
            if self.graph_meta is None:
                self.graph_meta = torch.zeros(host.size, dtype=torch.int32, device=indices.device)
            meta = self.graph_meta
            meta.copy_(torch.from_numpy(host), non_blocking=True)
            self.graph_indices[: indices.numel()].copy_(indices, non_blocking=True)
            self.indices = self.graph_indices
        self.indptr, self.work_ptr = meta[: rows + 1], meta[at : at + rows + 1]
        self.work = meta[2 * at :].view(3, items)
        # a graph with the split keeps the merge (a request alone in its span skips it); eager: only if needed
        self.part = self.lse = None
        if not disable_split_kv and (self.graph_rows is not None or spans > rows):
            buf = self.scratch.get(items * num_heads * (head_dim + 1))
            self.part, self.lse = buf[: items * num_heads * head_dim], buf[items * num_heads * head_dim :]

    def run(
        self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.kernel == "cuda":
            from kernels.attention.cuda_decode import decode
        else:
            from kernels.attention.fp8_decode import decode  # type: ignore[assignment]  # Triton: GPU machines only

        spans = (self.work, self.work_ptr, self.sm_scale, self.part, self.lse)
        args = (q, cache[0], cache[1], self.indptr, self.indices, *spans, out)
        if self.kernel == "cuda":
            return decode(*args, heads_together=CUDA_HEADS_TOGETHER)
        return decode(*args)
