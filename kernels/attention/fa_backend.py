"""FlashAttention-4 (`flash-attn-4`, module `flash_attn.cute`) paged attention on CUDA (sm80/sm90/sm100).

FA4 reads the pool as it is: per layer K and V of shape [num_pages, page_size, kv_heads, head_dim], with a
`page_table` [batch, max_pages] (int32) and `seqused_k` [batch] (keys per request) beside `cu_seqlens_q`
[batch + 1] for the packed queries. One plan per batch builds those three tensors on the host from the batch's
lists and sends them with non-blocking copies, so every layer of the step shares them and nothing waits for
the GPU. Unused entries of a page-table row are page 0 (never read: seqused_k bounds each row).

Pages load by TMA when a page holds exactly one key tile (page_size 128 for head_dim 128 on sm90); other page
sizes take FA4's cp.async path. Keys past seqused_k in a request's last page are masked, but on the TMA path
they are still multiplied in (0 * NaN = NaN): the pool starts zeroed and only ever holds finite K/V, so they are.

Kernels are JIT-compiled (nvidia-cutlass-dsl) per variant on first use; FA4 keeps them in memory, and on disk
with FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 (directory FLASH_ATTENTION_CUTE_DSL_CACHE_DIR). Decode works
(q length 1 per request) but is not captured in CUDA graphs: run decode on FlashInfer (`fa,flashinfer`) for that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernels.attention.base import AttentionBackend, AttnMeta
from kvcache.pool import KVPool


def import_fa4() -> Callable[..., Any]:
    """FA4's varlen entry point, or a ValueError saying how to get it."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as e:  # ImportError, or the CUTLASS DSL failing to load its libraries
        raise ValueError(
            "the fa attention backend needs FlashAttention-4: pip install 'minisgl[fa]' "
            f"(flash-attn-4 with nvidia-cutlass-dsl[cu13]); importing flash_attn.cute failed: {e!r}"
        ) from e
    fn: Callable[..., Any] = flash_attn_varlen_func
    return fn


def fa4_metadata(meta: AttnMeta, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cu_seqlens_q [B + 1], seqused_k [B] and page_table [B, max_pages], int32, on the device (non-blocking)."""
    b = len(meta.q_lens)
    width = max(1, max(len(t) for t in meta.page_tables))
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(meta.q_lens, dtype=torch.int32).cumsum(0)
    used = torch.tensor(meta.kv_lens, dtype=torch.int32)
    table = torch.tensor([t + [0] * (width - len(t)) for t in meta.page_tables], dtype=torch.int32)
    return (
        cu.to(device, non_blocking=True),
        used.to(device, non_blocking=True),
        table.to(device, non_blocking=True),
    )


class FlashAttention4Backend(AttentionBackend):
    def __init__(
        self,
        pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device,
        sliding_window: int | None = None,
    ):
        super().__init__(pool, num_heads, num_kv_heads, head_dim, sliding_window)
        self.attn = import_fa4()
        self.device = device
        # FA4's window counts keys left of the query's own (W visible positions: W - 1), right 0 = causal.
        self.window = (None, None) if sliding_window is None else (sliding_window - 1, 0)
        self.cu_q: torch.Tensor | None = None
        self.seqused_k: torch.Tensor | None = None
        self.page_table: torch.Tensor | None = None
        self.max_q = self.max_k = 0

    def plan(self, meta: AttnMeta) -> None:
        self.cu_q, self.seqused_k, self.page_table = fa4_metadata(meta, self.device)
        self.max_q, self.max_k = max(meta.q_lens), max(meta.kv_lens)
        self.out_slots = meta.out_slots

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, stored: bool = False
    ) -> torch.Tensor:
        assert self.out_slots is not None and self.page_table is not None
        if k is not None and v is not None and not stored:
            self.pool.store(layer, self.out_slots, k, v)
        out, _ = self.attn(
            q,
            self.pool.k[layer],
            self.pool.v[layer],
            cu_seqlens_q=self.cu_q,
            seqused_k=self.seqused_k,
            page_table=self.page_table,
            max_seqlen_q=self.max_q,
            max_seqlen_k=self.max_k,
            softmax_scale=self.scale,
            causal=True,
            window_size=self.window,
        )
        result: torch.Tensor = out
        return result
