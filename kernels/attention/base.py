"""The attention backend interface: plan once per batch, then every layer stores K/V and attends."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

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
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, KVH, D] for the new tokens, stored into the pool at `out_slots` here, or None
        when a fused kernel has stored them already. Returns [T, H, D]."""


def available_backends() -> list[str]:
    names = ["torch"]
    try:
        import flashinfer  # noqa: F401

        names.append("flashinfer")
    except Exception:
        pass
    return names


def create_backend(
    name: str,
    pool: KVPool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    device: torch.device,
    sliding_window: int | None = None,
) -> AttentionBackend:
    if name == "auto":
        name = "flashinfer" if device.type == "cuda" and "flashinfer" in available_backends() else "torch"
    if name == "torch":
        from kernels.attention.torch_backend import TorchBackend

        return TorchBackend(pool, num_heads, num_kv_heads, head_dim, sliding_window)
    if name == "flashinfer":
        if device.type != "cuda":
            raise ValueError("the flashinfer attention backend needs a CUDA device")
        if "flashinfer" not in available_backends():
            raise ValueError("the flashinfer attention backend needs the flashinfer-python package (extra 'gpu')")
        from kernels.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(pool, num_heads, num_kv_heads, head_dim, device, sliding_window)
    raise ValueError(f"unknown attention backend {name!r}; choose from auto, torch, flashinfer")
