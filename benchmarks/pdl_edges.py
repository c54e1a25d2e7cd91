"""Do cuBLAS's GEMMs wait for the kernel before them when a CUDA graph lets them launch early, and what would that save
in a decode step? (issue #17; GPU only)

    source .whl/use-bundle.sh && python benchmarks/pdl_edges.py --out $OUT/pdl_edges.json

cuBLAS launches its kernels itself, without programmatic dependent launch (PDL), so every GEMM of a decode step
starts only once the kernel before it has ended and its writes are flushed. A captured graph's edges can be made
programmatic after capture (the driver's `cuGraphAddDependencies_v2` with edge data), which lets the GEMM launch
before its predecessor ends. That is safe only if the GEMM's kernel executes `griddepcontrol.wait` before it reads
its input, which nothing documents for cuBLAS. So, first a probe:
- a Triton kernel lets its dependents launch at its start, spins, then writes `a = x` (after `a` was zeroed);
- the kernel after it reads `a`: a Triton kernel without the wait (a control: it must see zeros, or the edge had no
  effect), a Triton kernel with the wait (must see x), and cuBLAS's `a @ W^T` (the question);
- each through a programmatic edge from the spinning kernel, on both of the driver's ports for it.
Then `pdl_layer.py`'s `base` decode step (Qwen3-0.6B's 28 layers, paged KV at offline lengths) in modes (MODES):
the edges out of its GEMMs into RMSNorm and SiLU kernels that wait made programmatic, on either port, against the
graph as captured (`time_batch` says what each port allows); and, only where cuBLAS waited in every replay, the
edges into its GEMMs.
"""

from __future__ import annotations

import argparse
import ctypes
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

CU_GRAPH_NODE_TYPE_KERNEL = 0
CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC = 1
PORTS = {"programmatic": 1, "launch-order": 2}  # CU_GRAPH_KERNEL_NODE_PORT_*
GEMM_NAMES = ("nvjet", "gemm", "gemv", "xmma", "cutlass")


class EdgeData(ctypes.Structure):
    _fields_ = [
        ("from_port", ctypes.c_ubyte),
        ("to_port", ctypes.c_ubyte),
        ("type", ctypes.c_ubyte),
        ("reserved", ctypes.c_ubyte * 5),
    ]


class KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("params", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]


cuda = ctypes.CDLL("libcuda.so.1")


def _ok(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")


def kernel_names(graph: int) -> dict[int, str]:
    """{node: kernel name} of the graph's kernel nodes."""
    n = ctypes.c_size_t()
    _ok(cuda.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(n)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * n.value)()
    _ok(cuda.cuGraphGetNodes(ctypes.c_void_p(graph), nodes, ctypes.byref(n)), "cuGraphGetNodes")
    names: dict[int, str] = {}
    for node in nodes:
        kind = ctypes.c_int()
        _ok(cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "cuGraphNodeGetType")
        if kind.value != CU_GRAPH_NODE_TYPE_KERNEL:
            continue
        p = KernelNodeParams()
        _ok(cuda.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)), "cuGraphKernelNodeGetParams")
        name = ctypes.c_char_p()
        if p.func:
            _ok(cuda.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(p.func)), "cuFuncGetName")
        else:
            _ok(cuda.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(p.kern)), "cuKernelGetName")
        names[node or 0] = (name.value or b"?").decode()
    return names


def edges(graph: int) -> list[tuple[int, int, EdgeData]]:
    n = ctypes.c_size_t()
    g = ctypes.c_void_p(graph)
    _ok(cuda.cuGraphGetEdges_v2(g, None, None, None, ctypes.byref(n)), "cuGraphGetEdges")
    src, dst, data = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)(), (EdgeData * n.value)()
    _ok(cuda.cuGraphGetEdges_v2(g, src, dst, data, ctypes.byref(n)), "cuGraphGetEdges")
    return [(src[i] or 0, dst[i] or 0, data[i]) for i in range(n.value)]


def make_programmatic(graph: int, into, port: int) -> list[tuple[str, str]]:
    """Every plain edge between two kernel nodes whose (from name, to name) `into` accepts becomes programmatic
    through `port`. Returns the pairs changed."""
    names = kernel_names(graph)
    changed = []
    g = ctypes.c_void_p(graph)
    for a, b, d in edges(graph):
        if a not in names or b not in names or d.type != 0 or not into(names[a], names[b]):
            continue
        one = ctypes.c_void_p * 1
        _ok(cuda.cuGraphRemoveDependencies_v2(g, one(a), one(b), (EdgeData * 1)(d), 1), "cuGraphRemoveDependencies")
        new = EdgeData(from_port=port, to_port=0, type=CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)
        _ok(cuda.cuGraphAddDependencies_v2(g, one(a), one(b), (EdgeData * 1)(new), 1), "cuGraphAddDependencies")
        changed.append((names[a], names[b]))
    return changed


def is_gemm(name: str) -> bool:
    return any(k in name.lower() for k in GEMM_NAMES)


@triton.jit
def _spin_write(x_ptr, out_ptr, n, iters, BLOCK: tl.constexpr):
    tl.extra.cuda.gdc_launch_dependents()  # the next kernel may launch now
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    acc = x * 0.0
    for _ in range(iters):  # a serial chain the compiler cannot drop: ~4 cycles an iteration
        acc = acc * 0.5 + 1e-30
    tl.store(out_ptr + offs, (x + acc).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _read_twice(a_ptr, out_ptr, n, WAIT: tl.constexpr, BLOCK: tl.constexpr):
    if WAIT:
        tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, a * 2, mask=mask)


def probe(dev: torch.device, iters: int, replays: int) -> list[dict]:
    rows, k = 64, 1024
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, k, device=dev, dtype=torch.bfloat16) * 0.03
    a = torch.zeros_like(x)
    block = 1024

    def downstream(kind: str) -> torch.Tensor:
        if kind == "cublas":
            return F.linear(a, w)
        out = torch.empty_like(a)
        _read_twice[(triton.cdiv(a.numel(), block),)](a, out, a.numel(), kind == "triton-wait", block)
        return out

    want = {"cublas": F.linear(x, w), "triton-no-wait": x * 2, "triton-wait": x * 2}
    results = []
    for kind in want:
        for port_name, port in PORTS.items():

            def body(kind: str = kind) -> torch.Tensor:
                a.zero_()
                _spin_write[(triton.cdiv(x.numel(), block),)](x, a, x.numel(), iters, block)
                return downstream(kind)

            body()  # compile outside the graph
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(graph):
                y = body()
            changed = make_programmatic(graph.raw_cuda_graph(), lambda s, d: "_spin_write" in s, port)
            graph.instantiate()
            exact = stale = other = 0
            for _ in range(replays):
                graph.replay()
                torch.cuda.synchronize()
                if torch.equal(y, want[kind]):
                    exact += 1
                elif not y.any():
                    stale += 1  # read the zeros: started before the writes
                else:
                    other += 1
            row = dict(downstream=kind, port=port_name, edges=changed, replays=replays, exact=exact, stale=stale,
                       partly=other)  # fmt: skip
            print(row, flush=True)
            results.append(row)
    return results


def layer_step(batches: list[int], dev: torch.device, rounds: int, into_gemms: int | None) -> list[dict]:
    """pdl_layer.py's `base` step in modes (MODES), interleaved."""
    from layer_chain import layer_weights  # this script's folder is on sys.path

    weights = layer_weights(dev)
    return [time_batch(batch, weights, dev, rounds, into_gemms) for batch in batches]


# mode: (RMSNorm and SiLU compiled with griddepcontrol.wait, which edges become programmatic, through which port)
MODES = {
    "captured": (False, None, 0),
    "waiting-plain": (True, None, 0),
    "waiting-programmatic": (True, "out-of-gemms", PORTS["programmatic"]),
    "waiting-launch-order": (True, "out-of-gemms", PORTS["launch-order"]),
}
WAITING = ("_rmsnorm_pdl_kernel", "_silu_pdl_kernel")


def time_batch(batch: int, weights: list[dict], dev: torch.device, rounds: int, into_gemms: int | None) -> dict:
    """The GEMMs never signal their dependents, so a kernel after one launches once it has ended. A kernel that waits
    (`griddepcontrol.wait`) may launch earlier: through the programmatic port once the GEMM has ended but before its
    writes are flushed (what a PDL launch attribute gives; the forty-second session measured that a tie), through the
    launch-order port once all of the GEMM's blocks have begun (the kernel then sits resident at its wait). With
    `into_gemms` (a port; only where the probe found cuBLAS waiting) also the edges into the GEMMs."""
    from layer_chain import EPS, HIDDEN, DecodeBatch, Q, _rmsnorm_pdl_kernel, _silu_pdl_kernel, interleaved_step_ms

    from kernels import triton_ops

    db = DecodeBatch.draw(batch, torch.Generator().manual_seed(batch), dev)
    store, attn, kv = db.rope_store(dev), db.wrapper(dev), db.kv

    def norm(x: torch.Tensor, w: torch.Tensor, res: torch.Tensor, waits: bool) -> torch.Tensor:
        if not waits:
            return triton_ops.rmsnorm(x, w, EPS, res)
        out = torch.empty_like(x)
        _rmsnorm_pdl_kernel[(x.shape[0],)](x, res, w, out, HIDDEN, EPS, True, triton.next_power_of_2(HIDDEN))
        return out

    def silu(gu: torch.Tensor, waits: bool) -> torch.Tensor:
        if not waits:
            return triton_ops.silu_and_mul(gu)
        n = gu.shape[1] // 2
        out = torch.empty((gu.shape[0], n), dtype=gu.dtype, device=gu.device)
        _silu_pdl_kernel[(gu.shape[0], triton.cdiv(n, 1024))](gu, out, n, True, 1024)
        return out

    def step(x: torch.Tensor, res: torch.Tensor, waits: bool) -> torch.Tensor:
        for i, w in enumerate(weights):
            q = store(F.linear(norm(x, w["n1"], res, waits), w["qkv"]), i)
            o = attn.run(q, kv[i]).view(-1, Q)
            gu = F.linear(norm(F.linear(o, w["o"]), w["n2"], res, waits), w["gu"])
            x = F.linear(silu(gu, waits), w["down"])
        return x

    modes = dict(MODES)
    if into_gemms is not None:
        modes["into-gemms"] = (False, "into-gemms", into_gemms)
    rules = {
        "out-of-gemms": lambda a, b: is_gemm(a) and any(k in b for k in WAITING),
        "into-gemms": lambda a, b: is_gemm(b),
    }
    x0 = torch.randn(batch, HIDDEN, device=dev, dtype=torch.bfloat16)
    r0 = torch.randn(batch, HIDDEN, device=dev, dtype=torch.bfloat16)
    changed: dict[str, list[tuple[str, str]]] = {}

    def edit(mode: str, graph: int) -> None:
        _, rule, port = modes[mode]
        changed[mode] = make_programmatic(graph, rules[rule], port) if rule else []

    ms, outs = interleaved_step_ms(
        lambda mode, x, res: step(x, res, modes[mode][0]), list(modes), x0, r0, rounds, skip=3, edit=edit
    )
    saved = {m: (ms["captured"] - v) * 1e3 / len(weights) for m, v in ms.items()}
    ref = {False: outs["captured"], True: outs["waiting-plain"]}
    row = dict(
        batch=batch,
        ms=ms,
        us_saved_per_layer=saved,
        # each mode against the mode with the same kernels and no edges changed: bit for bit
        equal_outputs={m: bool(torch.equal(y, ref[modes[m][0]])) for m, y in outs.items()},
        edges_changed={m: len(c) for m, c in changed.items()},
        edge_kinds={m: sorted({f"{a[:32]} -> {b[:32]}" for a, b in c}) for m, c in changed.items()},
    )
    print(
        f"batch {batch:4}: "
        + "  ".join(f"{m} {v:.3f} ms ({saved[m]:+.2f} us/layer)" for m, v in ms.items())
        + f"  equal {row['equal_outputs']}  edges {row['edges_changed']}",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20000, help="spin iterations of the probe's first kernel")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--batches", default="16,64,128,256")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="pdl_edges.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    res: dict = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    res["probe"] = probe(dev, args.iters, args.replays)
    cublas = [r for r in res["probe"] if r["downstream"] == "cublas"]
    control = [r for r in res["probe"] if r["downstream"] == "triton-no-wait"]
    took_effect = any(r["stale"] for r in control)
    waits = {r["port"]: took_effect and r["exact"] == r["replays"] for r in cublas}
    res["cublas_waits"] = waits
    print(f"the edges took effect (the control read zeros): {took_effect}; cuBLAS read its input whole: {waits}")
    into = next((PORTS[p] for p, ok in waits.items() if ok), None)
    res["layer"] = layer_step([int(b) for b in args.batches.split(",")], dev, args.rounds, into)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
