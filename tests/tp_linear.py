"""Run under torchrun (gloo, CPU): the tensor-parallel linear layers' parts against the whole layer in one process.
RowParallelLinear.add_into: rank 0 adds its part to the residual in its GEMM, the others write theirs, the all-reduce
leaves residual + every part on every rank (the folded layers' o_proj and down_proj on CUDA). Rank 0 prints OK.

python -m torch.distributed.run --nproc-per-node N tests/tp_linear.py
"""

from __future__ import annotations

import os

import torch

from engine.distributed import TP, init_tp, leave_tp_group
from engine.layers import RowParallelLinear

init_tp(int(os.environ["WORLD_SIZE"]), "cpu")
g = torch.Generator().manual_seed(0)
w, x, residual = (
    torch.randn(6, 4 * TP.size, generator=g),
    torch.randn(3, 4 * TP.size, generator=g),
    torch.randn(3, 6, generator=g),
)
layer = RowParallelLinear(4 * TP.size, 6)
with torch.no_grad():
    layer.load_shard("weight", 0, w)
    out = residual.clone()
    layer.add_into(x[:, 4 * TP.rank : 4 * (TP.rank + 1)].contiguous(), out)
torch.testing.assert_close(out, residual + x @ w.T, rtol=1e-5, atol=1e-5)
leave_tp_group()
if TP.rank == 0:
    print("OK")
