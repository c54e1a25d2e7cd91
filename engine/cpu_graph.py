"""Decode steps on a CPU replayed as recorded C calls: what engine/cuda_graph.py does for a GPU, for the C kernels of
kernels/cpu_ops.py. With those kernels a decode step computes only in C, yet a forward of the embedded model made
~300 C calls from Python, each with its module calls, ctypes conversion and output allocation: about a third of a
one-row step (docs/benchmarks.md). The first decode step of each batch size runs the forward as usual over fixed input
buffers while kernels/cpu_ops.py records its calls (a Tape); each later step of that size writes its inputs into the
buffers and replays the tape in one call into the library."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from kernels import cpu_ops
from kernels.attention import AttnMeta
from kernels.attention.torch_backend import TorchBackend

if TYPE_CHECKING:
    from engine.runner import KVLayout, ModelRunner
    from engine.scheduler import Batch

ENV = "MINISGL_CPU_GRAPHS"  # 0: every decode step runs the forward from Python (for A/Bs)
# Tensor data read into Python: a recorded forward would keep the branch it took
_DATA_READS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__"}


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


class OnlyCCalls(TorchFunctionMode):
    """Watches a recorded forward for torch computations, which a replay of its C calls would leave out: `foreign`
    names the first (None: the forward only allocated buffers, took views of them and read their shapes and
    addresses). A torch function mode, not a dispatch mode: the first dispatch mode imports torch._dynamo (1.9 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.foreign: str | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.foreign is None and not _computes_nothing(func, args, out):
            self.foreign = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        return out


def _computes_nothing(func: Any, args: Any, out: Any) -> bool:
    """An allocation, or a call whose tensors out (if any) are views of its first argument's storage (reshape copies
    where strides do not allow a view), that neither writes in place nor reads data into Python."""
    name = getattr(func, "__name__", "")
    if name == "empty":
        return True
    if name in _DATA_READS or name.endswith("_") and not name.endswith("__") or name.startswith(("__i", "__set")):
        return False
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not tensors:
        return True
    if not args or not isinstance(args[0], torch.Tensor):
        return False
    base = args[0].untyped_storage().data_ptr()
    return all(t.untyped_storage().data_ptr() == base for t in tensors)


class CpuDecodeGraphs:
    """Recorded decode steps of up to max_bs rows, one tape per batch size, recorded at its first step."""

    enabled = True
    capture_seconds = 0.0  # nothing is recorded at start-up

    def __init__(self, runner: ModelRunner, max_bs: int):
        backend = runner.backend
        assert isinstance(backend, TorchBackend) and backend.cpu_ops
        self.model, self.backend, self.next_tokens = runner.model, backend, runner.next_tokens
        self.max_bs, self.page_size = max_bs, runner.pool.page_size
        # The inputs, fixed: each row's token, position, request slot, KV slot for its new token, KV length
        self.inputs = torch.zeros(5, max_bs, dtype=torch.int64)
        self.ids, self.pos, self.req_slots, self.out_slots, self.lens = self.inputs
        self.tapes: dict[int, cpu_ops.Tape] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.refused: dict[int, str] = {}  # batch size -> the torch op that kept its forward from being recorded
        self.recorded = self.replayed = 0  # steps
        self.rows = self.capacity = 0
        self._fit(1, 256)

    def _fit(self, rows: int, kv: int) -> None:
        """Room in the attention's buffers (each row's KV slot list and its scores) for `rows` rows of `kv` slots:
        grown as batches and contexts grow (the slot lists twice as long each time), so a one-stream chat holds one
        row's. Recorded tapes hold the old buffers' addresses, so they go and record again."""
        if rows <= self.rows and kv <= self.capacity:
            return
        self.rows = max(rows, self.rows)
        self.capacity = max(2 * self.capacity, kv) if kv > self.capacity else self.capacity
        self.idx = torch.zeros(self.rows, self.capacity, dtype=torch.int64)
        self.scratch = torch.empty(self.rows * self.backend.num_heads * self.capacity)
        self.tapes.clear()
        self.outputs.clear()

    def release(self) -> None:
        self.tapes.clear()
        self.outputs.clear()

    def can_run(self, batch: Batch) -> bool:
        n = len(batch.reqs)
        return batch.is_decode and n <= self.max_bs and n not in self.refused

    def run(self, batch: Batch, layout: KVLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """This decode batch's hidden states (replayed, or computed while recording) and its rows' request slots."""
        kv_lens, tables, out_slots = layout
        n = len(kv_lens)
        self._fit(n, max(kv_lens))
        slots = [r.slot for r in batch.reqs]
        host = self.inputs.numpy()
        host[0, :n] = self.next_tokens.numpy()[slots]
        host[1, :n] = batch.starts
        host[2, :n] = slots
        host[3, :n] = out_slots
        meta = AttnMeta(True, [1] * n, kv_lens, tables, self.out_slots[:n])
        self.backend.bind_decode(meta, self.idx[:n], self.lens[:n], self.scratch)  # fills the slot lists and lens
        tape = self.tapes.get(n)
        if tape is not None:
            tape.replay()
            self.replayed += 1
            return self.outputs[n], self.req_slots[:n]
        with cpu_ops.recording() as tape, OnlyCCalls() as guard:
            hidden: torch.Tensor = self.model(self.ids[:n], self.pos[:n], self.backend)
        self.recorded += 1
        if guard.foreign is not None:
            self.refused[n] = guard.foreign
        else:
            self.tapes[n], self.outputs[n] = tape, hidden
        return hidden, self.req_slots[:n]
