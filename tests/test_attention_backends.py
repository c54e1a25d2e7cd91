"""--attention-backend on the CPU: the names and PREFILL,DECODE splits it takes, the errors for the others, and a
split backend that hands each batch to the backend of its kind (torch for both here, as two instances)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.config import EngineConfig
from kernels.attention.base import AUTO_CUDA, AttnMeta, SplitBackend, create_backend, parse_backend
from kernels.attention.torch_backend import TorchBackend
from kvcache.pool import KVPool

CPU = torch.device("cpu")


def _pool() -> KVPool:
    return KVPool.create(1, 8, 4, 2, 8, torch.float32, "cpu")


@pytest.mark.parametrize(
    "name, parsed",
    [
        ("auto", ("auto", "auto")),
        ("fa", ("fa", "fa")),
        ("fa,flashinfer", ("fa", "flashinfer")),
        (" fa , torch ", ("fa", "torch")),
        ("auto,flashinfer", ("auto", "flashinfer")),
    ],
)
def test_parse_backend(name: str, parsed: tuple[str, str]) -> None:
    assert parse_backend(name) == parsed
    EngineConfig(attention_backend=name)  # the config accepts what parses


@pytest.mark.parametrize(
    "name, message",
    [
        ("magic", "unknown attention backend 'magic'"),
        ("fa,magic", "unknown attention backend 'magic' in 'fa,magic'"),
        ("fa,torch,x", "at most two names, PREFILL,DECODE"),
        ("fa,", "unknown attention backend ''"),
    ],
)
def test_bad_backend_names(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_backend(name)
    with pytest.raises(ValueError, match="attention_backend must be one of auto, torch, flashinfer, fa"):
        EngineConfig(attention_backend=name)


@pytest.mark.parametrize("name", ["fa", "fa,torch", "torch,fa", "flashinfer", "torch,flashinfer"])
def test_cuda_backends_on_the_cpu_say_so(name: str) -> None:
    with pytest.raises(ValueError, match="needs a CUDA device"):
        create_backend(name, _pool(), 4, 2, 8, CPU)


def test_fa_without_the_package_names_the_extra() -> None:
    from kernels.attention.fa_backend import import_fa4

    try:
        import flash_attn.cute  # noqa: F401

        pytest.skip("flash_attn.cute imports here")
    except Exception:
        pass
    with pytest.raises(ValueError, match=r"minisgl\[fa\].*flash-attn-4"):
        import_fa4()


def test_auto_is_torch_on_the_cpu_and_flashinfer_until_measured() -> None:
    assert isinstance(create_backend("auto", _pool(), 4, 2, 8, CPU), TorchBackend)
    assert isinstance(create_backend("auto,torch", _pool(), 4, 2, 8, CPU), TorchBackend)
    # No FlashAttention-4 measurement is recorded yet: auto must not pick it (base.py, AUTO_CUDA).
    assert AUTO_CUDA == {"prefill": "flashinfer", "decode": "flashinfer"}


def test_split_backend_routes_each_batch_kind() -> None:
    pool = _pool()
    pre, dec = TorchBackend(pool, 4, 2, 8), TorchBackend(pool, 4, 2, 8)
    split = SplitBackend(pre, dec)
    assert split.decode_backend() is dec and pre.decode_backend() is pre
    torch.manual_seed(0)
    # prefill 5 tokens into pages [1, 2], then decode one more at position 5
    q, k, v = torch.randn(5, 4, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    meta = AttnMeta(False, [5], [5], [[1, 2]], torch.tensor([4, 5, 6, 7, 8]))
    split.plan(meta)
    assert split.active is pre and split.out_slots is meta.out_slots
    out = split.forward(0, q, k, v)
    pre.plan(meta)
    torch.testing.assert_close(out, pre.forward(0, q, k, v))
    dmeta = AttnMeta(True, [1], [6], [[1, 2]], torch.tensor([9]))
    split.plan(dmeta)
    assert split.active is dec and split.out_slots is dmeta.out_slots
    q1, k1, v1 = torch.randn(1, 4, 8), torch.randn(1, 2, 8), torch.randn(1, 2, 8)
    got = split.forward(0, q1, k1, v1)
    dec.plan(dmeta)
    torch.testing.assert_close(got, dec.forward(0, q1, None, None))


def test_decode_splits_the_kv_only_when_the_batch_cannot_fill_the_gpu_evenly() -> None:
    from kernels.attention.flashinfer_backend import decode_split_kv

    slots = 264  # two CTAs on each of an H100's 132 SMs
    assert not decode_split_kv([1100] * 256, 8, slots)  # the offline workload mid-run: 2,048 even CTAs
    assert not decode_split_kv([600 + 7 * i for i in range(256)], 8, slots)  # uneven, but none beyond a slot's share
    assert decode_split_kv([1100] * 32, 8, slots)  # 256 CTAs: fewer than the slots
    assert decode_split_kv([2000], 8, slots)  # one request: its KV must be spread to use the GPU
    assert decode_split_kv([1100] * 255 + [32_000], 8, slots)  # one long request would keep its CTAs busy alone
    assert not decode_split_kv([1100] * 255 + [8_000], 8, slots)  # within one slot's share (~8.6k tokens)


def test_a_long_request_among_a_full_batch_of_decodes_gets_a_fixed_split(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernels.attention import flashinfer_backend as fb

    slots, pages = 264, fb.FIXED_SPLIT_PAGES
    assert pages > 0
    assert fb.fixed_split_pages([1100] * 255 + [32_000], 8, slots) == pages  # FlashInfer would split none of them
    assert fb.fixed_split_pages([1100] * 63 + [32_000], 8, slots) == pages  # 64 rows: 512 CTAs, none split either
    assert fb.fixed_split_pages([1100] * 256, 8, slots) == 0  # even: nothing to share out
    assert fb.fixed_split_pages([1100] * 255 + [8_000], 8, slots) == 0  # within one slot's share
    assert fb.fixed_split_pages([1100] * 255 + [16_000], 8, slots) == 0  # 1.8 shares: not far enough beyond
    assert fb.fixed_split_pages([1000] * 32 + [2048], 8, slots) == 0  # 2 shares (the offline workload: 1.27 at most)
    assert fb.fixed_split_pages([1100] * 31 + [32_000], 8, slots) == 0  # 256 CTAs: FlashInfer splits by itself
    monkeypatch.setattr(fb, "FIXED_SPLIT_PAGES", 0)
    assert fb.fixed_split_pages([1100] * 255 + [32_000], 8, slots) == 0


def test_the_offline_workload_never_plans_a_fixed_split() -> None:
    """Issue #17's figure is measured on the decode graphs: no decode step of the offline workload (every request in
    from the start, one token a step each until its output length) may take the fixed split's eager path, on a GPU of
    132 or 78 SMs (H100/H200's, an H20's) at Qwen3-0.6B's 8 KV heads."""
    from kernels.attention import flashinfer_backend as fb
    from minisgl_cli.workload import random_workload

    w = random_workload()
    assert w.output_tokens == 133_966
    for slots in (264, 156):
        for t in range(1, max(w.output_lens)):
            lens = [len(p) + t for p, n in zip(w.prompts, w.output_lens) if n > t]
            assert fb.fixed_split_pages(lens, 8, slots) == 0, (slots, t)


def test_the_ragged_part_of_a_prefill_is_the_trailing_run_of_fresh_prompts() -> None:
    from kernels.attention.flashinfer_backend import fresh_tail

    def meta(q_lens: list[int], kv_lens: list[int]) -> AttnMeta:
        return AttnMeta(False, q_lens, kv_lens, [[] for _ in q_lens], torch.zeros(0))

    # decode rows, a prompt's second chunk, then two prompts admitted now: the last two go ragged
    assert fresh_tail(meta([1, 1, 300, 500, 200], [700, 90, 800, 500, 200])) == 3
    assert fresh_tail(meta([500, 200], [500, 200])) == 0  # all fresh: one ragged pass
    assert fresh_tail(meta([1, 300], [40, 800])) == 2  # none fresh: the paged pass alone
    # a cached prefix (radix hit) after a fresh prompt: only what follows the last prefixed request is ragged
    assert fresh_tail(meta([500, 300, 200], [500, 812, 200])) == 2


def test_a_mixed_batch_attends_in_decode_paged_and_ragged_runs() -> None:
    from kernels.attention.flashinfer_backend import batch_parts, leading_decode_rows

    def meta(q_lens: list[int], kv_lens: list[int]) -> AttnMeta:
        return AttnMeta(False, q_lens, kv_lens, [[] for _ in q_lens], torch.zeros(0))

    # two decode rows, a prompt's second chunk, two prompts admitted now
    m = meta([1, 1, 300, 500, 200], [700, 90, 800, 500, 200])
    assert leading_decode_rows(m) == 2
    assert batch_parts(m, ragged=True, split_decode=True) == [("decode", 0, 2), ("paged", 2, 3), ("ragged", 3, 5)]
    assert batch_parts(m, ragged=True, split_decode=False) == [("paged", 0, 3), ("ragged", 3, 5)]
    assert batch_parts(m, ragged=False, split_decode=False) == [("paged", 0, 5)]
    # decode rows and fresh prompts, nothing between: no empty paged run
    assert batch_parts(meta([1, 1, 40], [9, 12, 40]), True, True) == [("decode", 0, 2), ("ragged", 2, 3)]
    # a one-token fresh prompt is not a decode row (no KV of its own); one before a prefixed request stays paged
    assert leading_decode_rows(meta([1, 1], [1, 50])) == 0
    assert batch_parts(meta([1, 1], [1, 50]), True, True) == [("paged", 0, 2)]
    # a one-token chunk after a cached prefix attends like a decode row
    assert batch_parts(meta([1, 1], [30, 50]), True, True) == [("decode", 0, 2)]


class _StubWrapper:
    """Stands in for a FlashInfer wrapper on the CPU: records its kernel family, its plans and its runs."""

    def __init__(self, workspace: torch.Tensor, layout: str, backend: str = "fa2", **kwargs: object):
        self.backend = backend
        self.plans: list[tuple[object, ...]] = []
        self.runs: list[tuple[torch.Tensor, tuple[object, ...]]] = []

    def plan(self, *args: object, **kwargs: object) -> None:
        self.plans.append(args)

    def run(self, q: torch.Tensor, *kv: object, out: torch.Tensor | None = None) -> torch.Tensor:
        self.runs.append((q, kv))
        assert out is not None and out.shape == q.shape
        return out


class _Decode(_StubWrapper):
    pass


class _Paged(_StubWrapper):
    pass


class _Ragged(_StubWrapper):
    pass


def _stub_flashinfer(monkeypatch: pytest.MonkeyPatch) -> Any:
    """flashinfer_backend on the CPU: FlashInfer's wrappers replaced by the stand-ins above, a 4-SM "GPU"."""
    import sys
    import types

    from kernels.attention import flashinfer_backend as fib

    stub = types.SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=_Decode,
        BatchPrefillWithPagedKVCacheWrapper=_Paged,
        BatchPrefillWithRaggedKVCacheWrapper=_Ragged,
    )
    monkeypatch.setitem(sys.modules, "flashinfer", stub)
    monkeypatch.setattr(fib, "WORKSPACE_BYTES", 64)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(multi_processor_count=4))
    return fib


def _laid_out(
    reqs: list[tuple[int, int]], page_size: int, kv_heads: int, dim: int, kv_dtype: torch.dtype | None = None
) -> tuple[KVPool, AttnMeta]:
    """A batch of (q_len, kv_len) requests on one layer's fp32 pool (stored as kv_dtype if given), each request's pages
    consecutive from page 1, its new tokens' slots in out_slots."""
    pages = [-(-kv // page_size) for _, kv in reqs]
    pool = KVPool.create(1, sum(pages) + 1, page_size, kv_heads, dim, torch.float32, "cpu", kv_dtype)
    tables, slots, at = [], [], 1
    for (q_len, kv), p in zip(reqs, pages):
        tables.append(list(range(at, at + p)))
        at += p
        pos = torch.arange(kv - q_len, kv)
        slots.append(torch.tensor(tables[-1])[pos // page_size] * page_size + pos % page_size)
    return pool, AttnMeta(False, [q for q, _ in reqs], [kv for _, kv in reqs], tables, torch.cat(slots))


@pytest.mark.parametrize("window", [None, 700])
@pytest.mark.parametrize("kv_heads", [8, 4, 2])  # groups of 2 (Qwen3-0.6B), 4 (Llama-3.1-8B), 8 (Qwen3-32B TP=4)
@pytest.mark.parametrize("chunks", ["long", "short"])
def test_flashinfer_parts_take_their_rows(
    monkeypatch: pytest.MonkeyPatch, kv_heads: int, window: int | None, chunks: str
) -> None:
    """The plumbing of a mixed batch's parts (kernels/attention/flashinfer_backend.py), on stand-in wrappers: which
    wrapper and kernel family each run of requests gets, the token rows each part runs on, and the new tokens' K/V a
    ragged part reads back from the pool when the caller stored them. The kernels' numbers are the GPU test's
    (tests/test_gpu.py::test_flashinfer_mixed_batch_parts_match_torch)."""
    fib = _stub_flashinfer(monkeypatch)
    H, D, PS = 16, 8, 4
    middle = [(300, 900), (200, 260)] + ([(17, 40), (1, 9)] if chunks == "short" else [])
    reqs = [(1, 5), (1, 12), (1, 7)] + middle + [(30, 30), (1, 1)]  # (q_len, kv_len): decode, chunks, fresh
    pool, meta = _laid_out(reqs, PS, kv_heads, D)
    q_lens = meta.q_lens
    pool.k[0].normal_()
    pool.v[0].normal_()
    be = fib.FlashInferBackend(pool, H, kv_heads, D, CPU, sliding_window=window)
    be.plan(meta)
    T = sum(q_lens)
    if window is not None:  # one paged fa2 pass over every row
        assert be.parts is None and be.active is be.prefill[0] and be.active.backend == "fa2"
        return
    rows = [sum(q_lens[:i]) for i in range(len(q_lens) + 1)]
    fresh = len(reqs) - 2
    if H // kv_heads >= 4:  # 4 or more query heads per KV head: the decode rows apart
        paged = be.chunks[0] if chunks == "long" else be.prefill[0]
        want = [(be.decode[0], 0, 3), (paged, 3, fresh), (be.ragged[0], fresh, len(reqs))]
    else:
        want = [(be.prefill[0], 0, fresh), (be.ragged[0], fresh, len(reqs))]
    assert be.parts == [(w, rows[a], rows[b], w is be.ragged[0]) for w, a, b in want]
    assert be.chunks[0].backend == "fa3" and be.prefill[0].backend == "fa2" and be.ragged[0].backend == "fa3"
    q = torch.randn(T, H, D)
    stored_k = pool.k[0].view(-1, kv_heads, D)[meta.out_slots]
    stored_v = pool.v[0].view(-1, kv_heads, D)[meta.out_slots]
    out = be.forward(0, q, None, None, stored=True)
    assert out.shape == q.shape
    for wrapper, a, b in want:
        ((ran_q, kv),) = wrapper.runs
        assert torch.equal(ran_q, q[rows[a] : rows[b]])
        if wrapper is be.ragged[0]:  # K/V read back from the pool at the fresh rows' slots
            assert torch.equal(kv[0], stored_k[rows[a] : rows[b]]) and torch.equal(kv[1], stored_v[rows[a] : rows[b]])
        else:
            assert kv[0] == (pool.k[0], pool.v[0])


def test_stored_kv_is_not_written_again() -> None:
    """The fused q/k/rope/KV kernel stores K/V itself and passes them on with stored=True (a backend may still
    read them): the pool must keep what the kernel wrote, and the output must be the same as storing here."""
    pool = _pool()
    be = TorchBackend(pool, 4, 2, 8)
    torch.manual_seed(0)
    q, k, v = torch.randn(5, 4, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    meta = AttnMeta(False, [5], [5], [[1, 2]], torch.tensor([4, 5, 6, 7, 8]))
    be.plan(meta)
    want = be.forward(0, q, k, v)
    written = pool.k[0].clone()
    got = be.forward(0, q, torch.zeros_like(k), torch.zeros_like(v), stored=True)
    torch.testing.assert_close(got, want)
    assert torch.equal(pool.k[0], written)


def test_span_decode_work_cuts_every_request_into_spans_of_one_length() -> None:
    """span_decode.span_decode_work, the split of the project's decode kernels (fp8 and CUDA): the spans tile each
    request's keys exactly, have one length (aligned to the kernel's step) but each request's last, number at most
    programs + requests and at most max_spans per request, so a lone long request is shared out among many programs;
    without a split, one span each."""
    from kernels.attention.span_decode import SPAN_ALIGN, span_decode_work

    def spans(work: np.ndarray, ptr: np.ndarray, r: int) -> list[tuple[int, int]]:
        assert (work[0, ptr[r] : ptr[r + 1]] == r).all()
        return [(int(a), int(b)) for a, b in work[1:, ptr[r] : ptr[r + 1]].T]

    rng = np.random.default_rng(0)
    cases = [np.array([21, 16, 33]), np.array([32_768] + [300] * 7), rng.integers(1, 5000, 200), np.array([1])]
    for lens in cases:
        for programs, max_spans in ((33, 32), (132, 32), (4, 2), (10_000, 32)):
            work, ptr = span_decode_work(lens, programs, True, max_spans)
            assert work.dtype == np.int32 and work.shape == (3, ptr[-1]) and len(ptr) == len(lens) + 1
            assert ptr[-1] <= programs + len(lens)
            span = work[2, 0] - work[1, 0] if ptr[1] > 1 else None
            for r, n in enumerate(lens):
                cut = spans(work, ptr, r)
                assert cut[0][0] == 0 and cut[-1][1] == n and all(a < b for a, b in cut)
                assert all(b == c for (_, b), (c, _) in zip(cut, cut[1:]))  # contiguous, no gap or overlap
                assert len(cut) <= max_spans and all(a % SPAN_ALIGN == 0 for a, _ in cut)
                if len(cut) > 1:
                    span = span or cut[0][1] - cut[0][0]
                    assert all(b - a == span for a, b in cut[:-1]) and cut[-1][1] - cut[-1][0] <= span
        work, ptr = span_decode_work(lens, 33, False, 32)
        assert ptr.tolist() == list(range(len(lens) + 1)) and work[1].tolist() == [0] * len(lens)
        assert work[2].tolist() == lens.tolist()
    # the long request among seven short ones, 33 programs: spans of 1,152 keys, 29 of them the long request's
    work, ptr = span_decode_work(np.array([32_768] + [300] * 7), 33, True, 32)
    assert work[2, 0] == 1152 and ptr[1] - ptr[0] == 29 and (np.diff(ptr)[1:] == 1).all()


def test_span_decode_wrapper_plans_spans_and_graph_buffers() -> None:
    """kernels/attention/span_decode.SpanDecodeWrapper, the planner of the fp8 and CUDA decodes (the kernels run
    on Hopper only: tests/test_gpu.py): context lengths from FlashInfer's page metadata, the spans and page table in one
    device buffer, merge scratch only where a request has several spans; a graph wrapper's fixed buffer refilled in
    place, its spans padded to the most a plan can make (request -1), the merge kept with a split, and the copy's
    shared page-id buffer refilled up to the batch's pages."""
    from kernels.attention.span_decode import SpanDecodeWrapper, SpanScratch

    indptr = torch.tensor([0, 2, 3, 6], dtype=torch.int32)  # 2, 1 and 3 pages of 16
    last = torch.tensor([5, 16, 1], dtype=torch.int32)
    indices = torch.tensor([7, 3, 9, 1, 2, 4], dtype=torch.int32)
    args = (indptr, indices, last, 4, 2, 8, 16)  # 4 query heads, 2 KV heads, dim 8, page 16

    def spans(w: SpanDecodeWrapper, n: int) -> list[list[int]]:
        """The plan's first n spans; the rest pad the stride to 16 with request -1, and every section of the metadata
        starts on 16 bytes (Triton compiles a kernel per alignment and per int divisibility by 16)."""
        assert w.work.shape[1] % 16 == 0 and (w.work[0, n:] == -1).all() and w.work.stride(1) == 1
        assert all(t.data_ptr() % 16 == 0 for t in (w.indptr, w.work_ptr, w.work))
        return w.work[:, :n].tolist()

    scratch = SpanScratch(CPU)
    eager = SpanDecodeWrapper(slots=64, scratch=scratch)
    eager.plan(*args, sm_scale=0.5, disable_split_kv=True, q_data_type=torch.bfloat16)
    assert spans(eager, 3) == [[0, 1, 2], [0, 0, 0], [21, 16, 33]] and eager.work_ptr.tolist() == [0, 1, 2, 3]
    assert eager.indptr.tolist() == [0, 2, 3, 6] and eager.indices is indices and eager.sm_scale == 0.5
    assert eager.part is None and eager.lse is None  # no request with several spans: no merge
    eager.plan(*args, sm_scale=0.5)  # 32 programs per KV head for 70 keys: one aligned span each
    assert spans(eager, 3) == [[0, 1, 2], [0, 0, 0], [21, 16, 33]] and eager.part is None
    long_last = torch.tensor([5, 16, 16], dtype=torch.int32)
    long = (torch.tensor([0, 2, 3, 30], dtype=torch.int32), torch.arange(30, dtype=torch.int32), long_last, 4, 2, 8, 16)
    eager.plan(*long, sm_scale=0.5)  # 21, 16 and 432 keys: the last in 4 spans of 128
    assert spans(eager, 6) == [[0, 1, 2, 2, 2, 2], [0, 0, 0, 128, 256, 384], [21, 16, 128, 256, 384, 432]]
    assert eager.work_ptr.tolist() == [0, 1, 2, 6]
    assert eager.part is not None and eager.lse is not None
    assert eager.part.numel() == 16 * 4 * 8 and eager.lse.numel() >= 16 * 4  # the padded spans
    assert eager.part.data_ptr() == scratch.kept[-1].data_ptr()
    first = scratch.kept[-1]
    scratch.get(first.numel() + 1)
    assert scratch.kept[0] is first and scratch.kept[-1].numel() == 2 * first.numel()  # grows; the old one kept

    for rows in range(1, 9):  # every batch size keeps the alignment
        lens = torch.full((rows,), 7, dtype=torch.int32)
        eager.plan(torch.arange(rows + 1, dtype=torch.int32), torch.arange(rows), lens, 4, 2, 8, 16, sm_scale=0.5)
        assert spans(eager, rows) == [list(range(rows)), [0] * rows, [7] * rows]

    shared_ids = torch.full((40,), -1, dtype=torch.int32)
    graph = SpanDecodeWrapper(slots=64, scratch=SpanScratch(CPU), graph_indices=shared_ids, graph_rows=3)
    graph.plan(*args, sm_scale=0.5)
    buf = graph.graph_meta
    assert buf is not None and graph.indices is shared_ids
    items = 48  # the most spans a split plan of 3 rows makes (rows + programs per KV head: 35), to a multiple of 16
    assert graph.work.shape == (3, items) and spans(graph, 3) == [[0, 1, 2], [0, 0, 0], [21, 16, 33]]
    assert graph.part is not None  # the graph keeps the merge
    assert shared_ids[:6].tolist() == [7, 3, 9, 1, 2, 4] and (shared_ids[6:] == -1).all()
    graph.plan(*long, sm_scale=0.5)
    assert graph.graph_meta is buf and graph.work.data_ptr() == buf[8:].data_ptr()  # refilled in place
    assert spans(graph, 6) == [[0, 1, 2, 2, 2, 2], [0, 0, 0, 128, 256, 384], [21, 16, 128, 256, 384, 432]]
    assert shared_ids[:30].tolist() == list(range(30))


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernels")


@pytest.mark.parametrize(
    "case",
    ["hopper", "fp16", "ampere", "turned-off", "no-cache", "head-dim-64", "no-nvcc", "nvcc-broken", "cache-is-a-file"],
)
def test_flashinfer_16_bit_pool_decodes_through_the_cuda_kernel_where_it_builds(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], kernel_cache: Path, tmp_path: Path, case: str
) -> None:
    """On Hopper, given a kernel cache (the engine names its own), heads of 128 dims, pages of 16 and a bf16 or fp16
    pool, the backend's decode wrappers (eager, and each CUDA-graph copy) are the CUDA decode's, built with the
    toolkit's real nvcc (the CPU machines have one; no GPU is needed to build) into that cache; its split is
    cuda_decode_split's. Elsewhere, turned off (MINISGL_CUDA_DECODE=0), or without nvcc (said on
    stderr, once), FlashInfer's wrappers."""
    from kernels import cuda_build
    from kernels.attention import cuda_decode
    from kernels.attention.span_decode import SpanDecodeWrapper

    if case != "no-nvcc" and cuda_build.nvcc() is None:
        pytest.skip("needs the CUDA toolkit's nvcc")
    fib = _stub_flashinfer(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0) if case == "ampere" else (9, 0))
    if case == "turned-off":
        monkeypatch.setenv("MINISGL_CUDA_DECODE", "0")
    cache: Path | None = None if case == "no-cache" else kernel_cache
    refused = case in ("no-nvcc", "nvcc-broken", "cache-is-a-file")
    if refused:  # nothing built in this process yet
        monkeypatch.setattr(cuda_decode, "_libs", {})
        monkeypatch.setattr(fib, "_cuda_decode_refused", set())
        cache = tmp_path / "cache"
    if case == "no-nvcc":  # a machine without the toolkit
        monkeypatch.setenv("PATH", str(tmp_path))
        monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    if case == "nvcc-broken":  # $CUDA_HOME/bin/nvcc there but not a program
        (tmp_path / "cuda" / "bin").mkdir(parents=True)
        (tmp_path / "cuda" / "bin" / "nvcc").write_text("")
        monkeypatch.setenv("PATH", str(tmp_path))
        monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    if case == "cache-is-a-file":  # a kernel cache that cannot be created
        (tmp_path / "cache").write_text("")
    H, KVH, D, PS = 4, 2, 64 if case == "head-dim-64" else 128, 16
    dtype = torch.float16 if case == "fp16" else torch.bfloat16
    pool = KVPool.create(1, 64, PS, KVH, D, dtype, "cpu")
    be = fib.FlashInferBackend(pool, H, KVH, D, CPU, kernel_cache=cache)
    runs = case in ("hopper", "fp16")
    assert be.cuda_decode == runs and be.span_kernel == ("cuda" if runs else None)
    graph = be.graph_wrapper(4, 0, True, max_pages=16)
    for w in (*be.decode, graph):
        assert isinstance(w, SpanDecodeWrapper) == runs and (not runs or w.kernel == "cuda")
    if runs:
        assert cuda_build.library_path(cuda_decode.SOURCE, kernel_cache).exists()
        # cuda_decode_split (4 SMs, 2 KV heads): one CTA per (request, KV head) unless they leave half the SMs
        # empty (one request) or a request is over 3 times a slot's share of the KV (2 slots per SM)
        assert be.split_kv([100]) and not be.split_kv([100] * 2) and not be.split_kv([100] * 7 + [2000])
        assert be.split_kv([100] * 7 + [3000])
        assert be.graph_splits(1) == (True,) and be.graph_splits(2) == (True, False)
        tables = [[1 + i] for i in range(7)] + [list(range(8, 8 + 188))]
        meta = AttnMeta(True, [1] * 8, [10] * 7 + [3000], tables, torch.arange(8))
        be.plan(meta)
        spans = be.active.work_ptr.diff().tolist()
        assert spans[:7] == [1] * 7 and spans[7] > 1
    err = capfd.readouterr().err
    assert ("the CUDA decode cannot be built" in err) == refused
    if refused:
        assert {"no-nvcc": "needs the CUDA toolkit's nvcc", "nvcc-broken": "Permission denied"}.get(
            case, "cannot create the kernel cache"
        ) in err
        fib.FlashInferBackend(pool, H, KVH, D, CPU, kernel_cache=cache)  # said once
        assert "cannot be built" not in capfd.readouterr().err


@pytest.mark.parametrize("capability, enabled", [((9, 0), True), ((9, 0), False), ((8, 0), True)])
def test_flashinfer_fp8_pool_decodes_through_the_triton_kernel_on_hopper(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], enabled: bool
) -> None:
    """Over an fp8 pool on Hopper the backend's decode wrappers (eager, and each CUDA-graph copy) are the Triton
    kernel's, and a mixed batch's decode rows go to it at any group (here 2), since FlashInfer's paged pass widens
    their fp8 KV as its decode does; elsewhere, or with TRITON_FP8_DECODE off, FlashInfer's wrappers and the bf16 rule
    (decode rows apart from a group of 4)."""
    from kernels.attention.span_decode import FP8_PROGRAMS_PER_SM, SpanDecodeWrapper
    from kvcache.pool import FP8

    fib = _stub_flashinfer(monkeypatch)
    monkeypatch.setattr(fib, "TRITON_FP8_DECODE", enabled)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: capability)
    H, KVH, D, PS = 16, 8, 16, 4
    reqs = [(1, 5), (1, 12), (300, 900), (30, 30)]  # (q_len, kv_len): two decode rows, a chunk, a fresh prompt
    pool, meta = _laid_out(reqs, PS, KVH, D, FP8)
    tables = meta.page_tables
    be = fib.FlashInferBackend(pool, H, KVH, D, CPU)
    triton = enabled and capability == (9, 0)
    assert be.fp8_decode == triton
    assert all(isinstance(w, SpanDecodeWrapper if triton else _Decode) for w in be.decode)
    be.plan(meta)
    assert be.parts is not None
    kinds = [type(w) for w, *_ in be.parts]
    assert kinds == ([SpanDecodeWrapper, _Paged, _Ragged] if triton else [_Paged, _Ragged])
    graph = be.graph_wrapper(2, 0, True, max_pages=16)
    assert isinstance(graph, SpanDecodeWrapper if triton else _Decode)
    if triton:  # the graph copy's buffers: the copy's shared page-id buffer and its own indptr / lengths
        assert isinstance(graph, SpanDecodeWrapper)
        decode = AttnMeta(True, [1, 1], [5, 12], tables[:2], torch.tensor([4, 11]))
        be.plan_graph(2, 16, decode, decode.out_slots, turn=0, split=True)
        assert graph.indices is be.graph_indices[0] and graph.work[:, :2].tolist() == [[0, 1], [0, 0], [5, 12]]
        # the split: wherever the spans cut some request (FP8_PROGRAMS_PER_SM per SM; 4 SMs here), not FlashInfer's rule
        assert be.span_slots == FP8_PROGRAMS_PER_SM * 4
        be.span_slots = 64  # 8 programs per KV head: spans of a multiple of 128 keys near an eighth of them all
        assert not be.split_kv([100] * 64) and not be.split_kv([100] * 63 + [1024])  # spans of 896 and 1,024
        assert be.split_kv([100] * 63 + [1100]) and be.split_kv([100] * 8 + [5000])  # 1,024 and 768
