"""Host-to-device copies of the small per-step inputs (positions, KV slots, page tables, sampling parameters).

Every such copy is queued on the current stream without the host waiting for it (a blocking copy would stall overlap
scheduling), and from pinned memory: a copy from pageable memory is staged by the driver first (issue #17's profile
showed the GPU idling between a step's pageable input copies). torch's caching host allocator keeps a pinned block
until the copies queued from it have run, so the host tensor may be dropped at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Off: the copies come from pageable memory, as before issue #17's thirteenth session (for its A/B only).
PINNED = True


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` (a host tensor) on `device`, its copy queued on the current stream."""
    if device.type != "cuda":
        return t.to(device)
    return (t.pin_memory() if PINNED else t).to(device, non_blocking=True)


def list_to_device(
    values: Sequence[int | float | bool], device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A short host list on `device` (see to_device)."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed host tensor to fill and then copy to `device` with to_device, pinned already where that pays."""
    return torch.zeros(shape, dtype=dtype, pin_memory=PINNED and device.type == "cuda")
