"""Reference attention over the paged pool in plain torch (CPU and GPU): gather each request's K/V, then SDPA."""

from __future__ import annotations

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
        ps, dev = self.pool.page_size, meta.out_slots.device
        slots = []
        for pages, kv_len in zip(meta.page_tables, meta.kv_lens):
            p = torch.tensor(pages, dtype=torch.int64)
            slots.append((p[:, None] * ps + torch.arange(ps)).flatten()[:kv_len])
        if meta.is_decode:
            # One padded gather for the whole batch: [B, max_kv] slots and a validity mask.
            max_kv = max(meta.kv_lens)
            idx = torch.zeros(len(slots), max_kv, dtype=torch.int64)
            for i, s in enumerate(slots):
                idx[i, : len(s)] = s
            self.idx = idx.flatten().to(dev)
            lens = torch.tensor(meta.kv_lens)
            self.idx_rows, self.lens = idx, lens  # for the C kernel
            self.mask: torch.Tensor | None = None  # every key visible (one stream): SDPA's faster maskless path
            if self.sliding_window is not None or min(meta.kv_lens) < max_kv:
                self.mask = self._visible(lens[:, None] - 1, torch.arange(max_kv)[None, :]).to(dev)[:, None, None, :]
        else:
            self.slots = [s.to(dev) for s in slots]
            self.masks = []
            for q_len, kv_len in zip(meta.q_lens, meta.kv_lens):
                qpos = torch.arange(kv_len - q_len, kv_len)
                self.masks.append(self._visible(qpos[:, None], torch.arange(kv_len)[None, :]).to(dev))

    def bind_decode(self, meta: AttnMeta, idx_rows: torch.Tensor, lens: torch.Tensor, scratch: torch.Tensor) -> None:
        """Plan a decode batch for the C kernel over buffers its caller keeps and fills (engine/cpu_graph.py's inputs):
        idx_rows [B, capacity] each row's KV slots, the first lens[b] of row b used; scratch [B * heads * capacity]."""
        self.meta, self.out_slots = meta, meta.out_slots
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
