"""The paged KV pool: per layer, K and V of shape [num_pages, page_size, kv_heads, head_dim].

Stored in the model's dtype, or in fp8 (e4m3, `--kv-cache-dtype fp8`): half the bytes per token, so twice the
tokens in the same memory and half the bytes a decode step's attention reads. fp8 values are stored with scale 1, as
vLLM and SGLang do for checkpoints without calibrated KV scales; what falls outside e4m3's +-448 saturates."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """On the CPU, zeros whose memory the OS maps in as it is first written: torch.zeros writes every byte of a
    pool up front, so an idle 1 GiB pool cost 1 GiB of RAM; numpy's zeros come from calloc (fresh zero pages)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)


FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)


@dataclass(slots=True)
class KVPool:
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    page_size: int
    num_pages: int
    compute_dtype: torch.dtype  # what attention computes in (the model's dtype); K/V are read back as this

    @property
    def dtype(self) -> torch.dtype:
        """The stored dtype: compute_dtype, or FP8."""
        return self.k[0].dtype

    @property
    def quantized(self) -> bool:
        return self.dtype != self.compute_dtype

    @staticmethod
    def create(
        num_layers: int,
        num_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kv_dtype: torch.dtype | None = None,  # stored dtype if not `dtype`: FP8
    ) -> KVPool:
        if kv_dtype not in (None, dtype, FP8):
            raise ValueError(f"a KV pool stores its compute dtype or {FP8}, not {kv_dtype}")
        shape = (num_pages, page_size, kv_heads, head_dim)
        k = [_zeros(shape, kv_dtype or dtype, device) for _ in range(num_layers)]
        v = [_zeros(shape, kv_dtype or dtype, device) for _ in range(num_layers)]
        return KVPool(k, v, page_size, num_pages, dtype)

    @staticmethod
    def pages_for_budget(budget_bytes: int, bytes_per_token: int, page_size: int) -> int:
        return max(budget_bytes // (bytes_per_token * page_size), 0)

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens' K/V at flat slot indices (page * page_size + offset)."""
        kv_shape = (-1,) + tuple(self.k[layer].shape[2:])
        if not self.quantized:
            self.k[layer].view(kv_shape).index_copy_(0, slots, k)
            self.v[layer].view(kv_shape).index_copy_(0, slots, v)
            return
        for cache, new in ((self.k[layer], k), (self.v[layer], v)):  # index_copy_ has no fp8 kernel: copy bytes
            fp8 = new.clamp(-FP8_MAX, FP8_MAX).to(FP8)
            cache.view(torch.uint8).view(kv_shape).index_copy_(0, slots, fp8.view(torch.uint8))

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at flat slot indices, [N, kv_heads, head_dim] each, in compute_dtype."""
        kv_shape = (-1,) + tuple(self.k[layer].shape[2:])
        out = []
        for cache in (self.k[layer], self.v[layer]):
            if not self.quantized:  # index_select: a third of advanced indexing's time per call on a CPU
                out.append(cache.view(kv_shape).index_select(0, slots))
            else:  # fp8 has no index kernels everywhere: gather the bytes
                raw = cache.view(torch.uint8).view(kv_shape).index_select(0, slots)
                out.append(raw.view(FP8).to(self.compute_dtype))
        return out[0], out[1]
