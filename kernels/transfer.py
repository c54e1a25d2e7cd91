"""Host -> device copies for per-step metadata, made so that they never wait for the GPU."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`, queued on the current stream without blocking the host. A copy from pageable memory goes
    through the driver's staging buffer, and once that is full the call blocks until the stream has drained up to
    it: under overlap scheduling, the whole step still running (benchmarks/h2d_sync_check.py). From pinned memory it
    is a plain DMA; PyTorch's caching host allocator holds the pinned block until the copy has completed."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def int32_tensor(values: Iterable[int], count: int) -> torch.Tensor:
    """A flat int32 tensor from an iterable of known length: 0.8 ms for 35k page ids on the 2-core CPU machine,
    against 3.2 ms for torch.tensor(list(...))."""
    return torch.from_numpy(np.fromiter(values, dtype=np.int32, count=count))
