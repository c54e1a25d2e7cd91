"""The paged KV pool: per layer, K and V of shape [num_pages, page_size, kv_heads, head_dim]."""

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


@dataclass(slots=True)
class KVPool:
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    page_size: int
    num_pages: int

    @staticmethod
    def create(
        num_layers: int,
        num_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> KVPool:
        shape = (num_pages, page_size, kv_heads, head_dim)
        k = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        v = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        return KVPool(k, v, page_size, num_pages)

    @staticmethod
    def pages_for_budget(budget_bytes: int, bytes_per_token: int, page_size: int) -> int:
        return max(budget_bytes // (bytes_per_token * page_size), 0)

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens' K/V at flat slot indices (page * page_size + offset)."""
        kv_shape = (-1,) + tuple(self.k[layer].shape[2:])
        self.k[layer].view(kv_shape).index_copy_(0, slots, k)
        self.v[layer].view(kv_shape).index_copy_(0, slots, v)
