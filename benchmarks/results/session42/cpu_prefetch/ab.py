import ctypes, subprocess, sys, time, statistics
import torch
from engine.config import EngineConfig
from engine.llm import LLM
from kernels.cpu_ops import QuantMatrix
rows_list = [int(r) for r in sys.argv[2].split(",")]
srcs = sys.argv[3:]
libs = []
for i, src in enumerate(srcs):
    so = f"/tmp/pf/v{i}.so"
    subprocess.run(["cc", "-O3", "-march=" + __import__("os").environ.get("MARCH", "native"), "-fopenmp", "-shared", "-fPIC", src, "-o", so, "-lm"], check=True)
    lib = ctypes.CDLL(so); p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.q4_1_matmul.argtypes = [p, i64, i64, p, p, p, i64, p]; lib.q8_0_matmul.argtypes = [p, i64, i64, p, p, i64, p]
    libs.append(lib)
torch.set_num_threads(int(sys.argv[1]))
llm = LLM(EngineConfig())
qs = [m.quant for m in llm.engine.runner.model.modules() if isinstance(getattr(m, "quant", None), QuantMatrix)]
for R in rows_list:
    xs = {q.shape[1]: torch.randn(R, q.shape[1]) for q in qs}
    ys = [{q.shape[0]: torch.empty(R, q.shape[0]) for q in qs} for _ in libs]
    def run(v):
        lib, y = libs[v], ys[v]
        for q in qs:
            n, k = q.shape; a, d, m = q._ptrs
            if m: lib.q4_1_matmul(xs[k].data_ptr(), R, k, a, d, m, n, y[n].data_ptr())
            else: lib.q8_0_matmul(xs[k].data_ptr(), R, k, a, d, n, y[n].data_ptr())
    times = [[] for _ in libs]
    for r in range(40 if R == 1 else 12):
        for v in (range(len(libs)) if r % 2 == 0 else reversed(range(len(libs)))):
            t = time.perf_counter(); run(v); times[v].append(time.perf_counter() - t)
    for v, s in enumerate(srcs):
        same = all(torch.equal(ys[v][k], ys[0][k]) for k in ys[0])
        print(f"threads {sys.argv[1]} rows {R:2d} {s:14s} median {statistics.median(times[v])*1e3:7.2f} ms  best {min(times[v])*1e3:7.2f}  ratio to first {statistics.median(times[0])/statistics.median(times[v]):.3f}  same: {same}", flush=True)
