"""kernels/cpu_ops.dense_matmul against torch's F.linear on SmolLM2's 120 layer matrices (fp32, stored transposed as
engine/layers.py lays them out on a CPU), 2 threads: correctness against float64 at several shapes, then the best of
4 passes over all matrices at 1-16 rows.

    .venv/bin/python benchmarks/results/session44/cpu_dense_matmul/matmuls_ab.py /tmp/kernel-cache
"""

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels import cpu_ops

print(cpu_ops.load(Path(sys.argv[1])))
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
for n, k in [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576), (100, 37), (40, 3)]:
    wt = torch.randn(k, n, generator=g).t()
    b = torch.randn(n, generator=g)
    for m in (1, 3, 6, 7, 16):
        x = torch.randn(m, k, generator=g)
        ref = (x.double() @ wt.double().t() + b.double()).float()
        for bb in (b, None):
            got = cpu_ops.dense_matmul(x, wt, bb)
            r = ref if bb is not None else (x.double() @ wt.double().t()).float()
            err = ((got - r).abs().max() / r.abs().max()).item()
            assert err < 1e-5, (n, k, m, err)
print("ok")
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30
WT = [torch.randn(i, o).t() for o, i in shapes]
for M in (1, 2, 4, 8, 16):
    res = []
    xs = {w.shape[1]: torch.randn(M, w.shape[1]) for w in WT}
    for name, f in (("torch", lambda a, w: F.linear(a, w)), ("C", lambda a, w: cpu_ops.dense_matmul(a, w))):
        best = 1e9
        for _rep in range(4):
            t = time.perf_counter()
            for w in WT:
                f(xs[w.shape[1]], w)
            best = min(best, time.perf_counter() - t)
        res.append(f"{name} {best * 1e3:.1f} ms")
    print(M, res)
