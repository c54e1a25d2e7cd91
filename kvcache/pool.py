"""The paged KV pool: per layer, K and V of shape [num_pages, page_size, kv_heads, head_dim]."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
        k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        return KVPool(k, v, page_size, num_pages)

    @staticmethod
    def pages_for_budget(budget_bytes: int, bytes_per_token: int, page_size: int) -> int:
        return max(budget_bytes // (bytes_per_token * page_size), 0)

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens' K/V at flat slot indices (page * page_size + offset)."""
        kv_shape = (-1,) + tuple(self.k[layer].shape[2:])
        self.k[layer].view(kv_shape).index_copy_(0, slots, k)
        self.v[layer].view(kv_shape).index_copy_(0, slots, v)
