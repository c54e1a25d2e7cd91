"""The attention backend interface: plan once per batch, then every layer stores K/V and attends."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch

from kvcache.pool import KVPool


@dataclass(slots=True)
class AttnMeta:
    """One batch, described per request. Token j of request i sits at position kv_lens[i] - q_lens[i] + j."""

    is_decode: bool
    q_lens: list[int]
    kv_lens: list[int]  # tokens of KV after this step (prefix + new)
    page_tables: list[list[int]]  # pages covering [0, kv_len) per request
    out_slots: torch.Tensor  # [T] flat pool slot of each new token, on the device


class AttentionBackend(ABC):
    """Causal attention; with a `sliding_window` W a query at position p sees keys at positions p - W + 1 .. p (the
    pool keeps the older ones: prefix sharing and chunking work as without a window, the mask hides them)."""

    def __init__(
        self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int, sliding_window: int | None = None
    ):
        self.pool = pool
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.sliding_window = sliding_window
        self.scale = head_dim**-0.5
        self.out_slots: torch.Tensor | None = None  # flat pool slots of the planned batch's new tokens

    @abstractmethod
    def plan(self, meta: AttnMeta) -> None:
        """Build per-batch metadata shared by every layer."""

    @abstractmethod
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, stored: bool = False
    ) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, KVH, D] for the new tokens, stored into the pool at `out_slots` here unless
        `stored` (a fused kernel wrote them already; they may still be read from k/v). k/v None: stored, not at
        hand. Returns [T, H, D]."""

    def decode_backend(self) -> AttentionBackend:
        """The backend that runs decode batches (CUDA graphs capture it alone)."""
        return self


BACKENDS = ("torch", "flashinfer", "fa")
# The head dims FlashInfer dispatches to (DISPATCH_HEAD_DIM, include/flashinfer/utils.cuh; vLLM checks the same list).
# Another one failed minutes into the engine's start, in FlashInfer's JIT build (ninja's output; tiny-llama's 16 on an
# H200, thirty-seventh session).
FLASHINFER_HEAD_DIMS = (64, 128, 256)

# What `auto` picks per phase on CUDA, where that package imports. Each entry must cite a measurement (GPU, date,
# source) that shows it faster there; none has been measured for FlashAttention-4 yet (docs/gpu.md,
# "FlashAttention-4 backend"), so both phases stay on FlashInfer, the measured default.
AUTO_CUDA = {"prefill": "flashinfer", "decode": "flashinfer"}


def parse_backend(name: str) -> tuple[str, str]:
    """`X` -> (X, X); `X,Y` -> (X for prefill and mixed batches, Y for decode). Names: auto, torch, flashinfer, fa."""
    parts = [p.strip() for p in name.split(",")]
    choices = ", ".join(("auto",) + BACKENDS)
    if len(parts) > 2:
        raise ValueError(f"attention backend {name!r}: at most two names, PREFILL,DECODE (e.g. fa,flashinfer)")
    for p in parts:
        if p != "auto" and p not in BACKENDS:
            raise ValueError(f"unknown attention backend {p!r} in {name!r}; choose from {choices}, or PREFILL,DECODE")
    return (parts[0], parts[-1])


def available_backends() -> list[str]:
    names = ["torch"]
    try:
        import flashinfer  # noqa: F401

        names.append("flashinfer")
    except Exception:
        pass
    try:
        import flash_attn.cute  # noqa: F401

        names.append("fa")
    except Exception:
        pass
    return names


class SplitBackend(AttentionBackend):
    """One backend for prefill (and mixed) batches, another for decode batches; both over the same pool.
    Each batch is planned, and its layers run, on the backend of its kind."""

    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend):
        super().__init__(prefill.pool, prefill.num_heads, prefill.num_kv_heads, prefill.head_dim)
        self.sliding_window = prefill.sliding_window
        self.prefill, self.decode = prefill, decode
        self.active = decode

    def plan(self, meta: AttnMeta) -> None:
        self.active = self.decode if meta.is_decode else self.prefill
        self.active.plan(meta)
        self.out_slots = self.active.out_slots

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, stored: bool = False
    ) -> torch.Tensor:
        return self.active.forward(layer, q, k, v, stored)

    def decode_backend(self) -> AttentionBackend:
        return self.decode


def _resolve_auto(phase: str, device: torch.device) -> str:
    if device.type != "cuda":
        return "torch"
    pick = AUTO_CUDA[phase]
    return pick if pick in available_backends() else "torch"


def resolve_backends(name: str, device: torch.device) -> tuple[str, str]:
    """The (prefill, decode) backends `name` runs on `device`: `auto` resolves per phase (AUTO_CUDA on CUDA, where
    that package imports; torch elsewhere)."""
    prefill, decode = parse_backend(name)
    prefill = _resolve_auto("prefill", device) if prefill == "auto" else prefill
    decode = _resolve_auto("decode", device) if decode == "auto" else decode
    return prefill, decode


def _create_one(
    name: str,
    pool: KVPool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    device: torch.device,
    sliding_window: int | None,
    kernel_cache: Path | None,
) -> AttentionBackend:
    if name == "torch":
        from kernels.attention.torch_backend import TorchBackend

        return TorchBackend(pool, num_heads, num_kv_heads, head_dim, sliding_window)
    if name == "flashinfer":
        if device.type != "cuda":
            raise ValueError("the flashinfer attention backend needs a CUDA device")
        if "flashinfer" not in available_backends():
            raise ValueError("the flashinfer attention backend needs the flashinfer-python package (extra 'gpu')")
        if head_dim not in FLASHINFER_HEAD_DIMS:
            raise ValueError(
                f"FlashInfer has attention kernels for head_dim {', '.join(map(str, FLASHINFER_HEAD_DIMS))} only, and "
                f"this model's is {head_dim}: use --attention-backend torch"
            )
        from kernels.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(pool, num_heads, num_kv_heads, head_dim, device, sliding_window, kernel_cache)
    if name == "fa":
        if pool.quantized:
            raise ValueError("the fa (FlashAttention-4) attention backend reads no fp8 KV cache; use flashinfer")
        if device.type != "cuda":
            raise ValueError("the fa (FlashAttention-4) attention backend needs a CUDA device")
        from kernels.attention.fa_backend import FlashAttention4Backend

        return FlashAttention4Backend(pool, num_heads, num_kv_heads, head_dim, device, sliding_window)
    raise ValueError(f"unknown attention backend {name!r}")


def create_backend(
    name: str,
    pool: KVPool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    device: torch.device,
    sliding_window: int | None = None,
    kernel_cache: Path | None = None,  # where the project's CUDA kernels are built (the engine's cache); None: not
) -> AttentionBackend:
    """`name` as parse_backend takes it, resolved by resolve_backends."""
    prefill, decode = resolve_backends(name, device)
    args = (pool, num_heads, num_kv_heads, head_dim, device, sliding_window, kernel_cache)
    if prefill == decode:
        return _create_one(prefill, *args)
    return SplitBackend(_create_one(prefill, *args), _create_one(decode, *args))
