"""Reference attention over the paged pool in plain torch (CPU and GPU): gather each request's K/V, then SDPA."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from kernels import cpu_ops
from kernels.attention.base import AttentionBackend, AttnMeta


class TorchBackend(AttentionBackend):
    # Decode through the C kernel (kernels/cpu_ops.py: K/V store and attention in one call, no gather) where the
    # engine switched it on: fp32 on a CPU, no sliding window.
    cpu_ops = False

    def plan(self, meta: AttnMeta) -> None:
        self.meta, self.out_slots = meta, meta.out_slots
        self.scratch: torch.Tensor | None = None  # the C kernel's scores: its own buffer per call
        dev = meta.out_slots.device
        if meta.is_decode:
            # One padded gather for the whole batch: [B, max_kv] slots and a validity mask.
            b, max_kv = len(meta.kv_lens), max(meta.kv_lens)
            self.bind_decode(meta, torch.zeros(b, max_kv, dtype=torch.int64), torch.empty(b, dtype=torch.int64))
            self.idx = self.idx_rows.flatten().to(dev)
            self.mask: torch.Tensor | None = None  # every key visible (one stream): SDPA's faster maskless path
            if self.sliding_window is not None or min(meta.kv_lens) < max_kv:
                visible = self._visible(self.lens[:, None] - 1, torch.arange(max_kv)[None, :])
                self.mask = visible.to(dev)[:, None, None, :]
        else:
            ps = self.pool.page_size
            self.slots = [torch.from_numpy(_kv_slots(p, n, ps)).to(dev) for p, n in zip(meta.page_tables, meta.kv_lens)]
            self.masks = []
            for q_len, kv_len in zip(meta.q_lens, meta.kv_lens):
                qpos = torch.arange(kv_len - q_len, kv_len)
                self.masks.append(self._visible(qpos[:, None], torch.arange(kv_len)[None, :]).to(dev))

    def bind_decode(
        self, meta: AttnMeta, idx_rows: torch.Tensor, lens: torch.Tensor, scratch: torch.Tensor | None = None
    ) -> None:
        """Plan a decode batch for the C kernel over CPU buffers the caller holds (plan's own, or engine/cpu_graph.py's
        fixed inputs): fills idx_rows [B, >= max KV length] with each row's KV slots and lens [B] with their counts.
        scratch: room for the kernel's B * heads * idx_rows.shape[1] scores (None: a buffer per call)."""
        self.meta, self.out_slots = meta, meta.out_slots
        rows, counts, ps = idx_rows.numpy(), lens.numpy(), self.pool.page_size
        for b, (pages, kv_len) in enumerate(zip(meta.page_tables, meta.kv_lens)):
            rows[b, :kv_len] = _kv_slots(pages, kv_len, ps)
            counts[b] = kv_len
        self.idx_rows, self.lens, self.scratch = idx_rows, lens, scratch

    def _visible(self, qpos: torch.Tensor, kpos: torch.Tensor) -> torch.Tensor:
        """Which key positions each query position attends to: causal, within the sliding window if any."""
        mask = kpos <= qpos
        if self.sliding_window is not None:
            mask &= kpos > qpos - self.sliding_window
        return mask

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, stored: bool = False
    ) -> torch.Tensor:
        if (
            self.cpu_ops
            and not self.pool.quantized
            and self.meta.is_decode
            and k is not None
            and v is not None
            and not stored
            and self.sliding_window is None
        ):
            assert self.out_slots is not None
            pool_k, pool_v = self.pool.k[layer], self.pool.v[layer]
            return cpu_ops.decode_attention(
                q, k, v, self.out_slots, pool_k, pool_v, self.idx_rows, self.lens, self.scale, self.scratch
            )
        if k is not None and v is not None and not stored:
            assert self.out_slots is not None
            self.pool.store(layer, self.out_slots, k, v)
        if self.meta.is_decode:
            shape = (len(self.meta.kv_lens), -1, self.num_kv_heads, self.head_dim)
            ks, vs = (x.view(shape).transpose(1, 2) for x in self.pool.gather(layer, self.idx))  # [B, KVH, L, D]
            o = F.scaled_dot_product_attention(
                q.unsqueeze(2), ks, vs, attn_mask=self.mask, scale=self.scale, enable_gqa=True
            )
            return o.squeeze(2)
        outs, start = [], 0
        for slots, mask, q_len in zip(self.slots, self.masks, self.meta.q_lens):
            qi = q[start : start + q_len].transpose(0, 1).unsqueeze(0)
            ki, vi = (x.transpose(0, 1).unsqueeze(0) for x in self.pool.gather(layer, slots))
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=self.scale, enable_gqa=True)
            outs.append(o[0].transpose(0, 1))
            start += q_len
        return torch.cat(outs)


def _kv_slots(pages: list[int], kv_len: int, page_size: int) -> np.ndarray:
    """A request's first kv_len pool slots, from its page table."""
    return (np.asarray(pages, dtype=np.int64)[:, None] * page_size + np.arange(page_size)).ravel()[:kv_len]
