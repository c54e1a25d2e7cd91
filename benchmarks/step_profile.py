"""Where the wall time of the offline workload goes, step by step (GPU). Run on the GPU machine:

    source .whl/use-bundle.sh && python benchmarks/step_profile.py --out $OUT/step_profile.json \
        --variant base --variant unfused

Each variant runs the default bench-offline workload (256 requests, 133,966 output tokens) once after a warm-up
and records, per engine step, CUDA events around the launch: the GPU time of the step and the idle gap before it
(the GPU waiting for the CPU). Steps are summed by kind (prefill / decode by batch size); each decode bucket also
gets its bytes floor per step (the weights and its requests' KV at the copy bandwidth) and the GPU time above it.
With --kernels, a second run under torch.profiler (CUDA activity only) sums kernel time by category over the whole
workload.

Variants switch one optimisation off to measure what it buys: `unfused` (separate q/k norm, rope, KV store),
`logits-fp32` (a float32 copy of the logits before sampling); or try one change: `decode-fa3` / `prefill-fa3`
(FlashInfer's Hopper kernels for that wrapper instead of fa2), `page32` / `page64` (KV page size), `blaslt` (torch's
cuBLASLt GEMM path instead of its default), `split-always` (decode always splits the KV over CTAs and merges the
parts, FlashInfer's choice in CUDA-graph mode, instead of only for batches too small or too uneven to fill the GPU),
`fi-decode` (FlashInfer's tensor-core decode over the bf16 pool instead of the project's CUDA kernel). Ablations
(wrong tokens by design, timing only: the workload ignores EOS, so the schedule is the same): `no-qkv`, `no-norm`,
`no-silu`, `no-norm-silu` skip that small kernel in decode batches, bounding what folding it away could save (the
norm ablations on the layers without the norms' fold); `no-qkv-silu` skips both small kernels the folded layer keeps
(what GEMMs with those kernels in their epilogues could save at most). `no-fold`: the RMSNorms as kernels of their
own (residual add fused in), as before the sixty-first session. `no-runs`: a request takes its pages one at a time
(as before the sixty-second session) instead of in runs of `kvcache.manager.RUN_PAGES`; `runs-32`: in runs of 32.
`pieces-16k`: the prefill's steps (16,384 tokens) replay piecewise graphs as steps up to 4,096 tokens do;
`budget-32k`: a per-step token budget of 32,768 (the prefill in 5 steps instead of 9). `cuda-cores`: the CUDA
decode's products on the CUDA cores (fp32 FMAs, as before the sixty-sixth session) instead of the tensor cores.
`adds-first`: generate() adds all 256 prompts before its first step (as before the sixty-sixth session) instead of
as its steps need them.
A fresh GPU machine runs slower for its first ~30 s:
repeat variants, interleaved, and compare the later runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.runner import StepOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Batch
from kvcache import manager
from minisgl_cli.bench_offline import OFFLINE_ENGINE
from minisgl_cli.roofline import bandwidth_for, gpu_floor, weight_bytes_per_step
from minisgl_cli.workload import random_workload

KERNEL_KINDS = [  # (category, regex on the kernel name), first match wins
    ("attention", r"BatchPrefill|BatchDecode|Persistent|MergeState|VariableLengthMerge|flashinfer|paged_decode|_merge"),
    ("qkv-fused", r"_qkv_kernel"),
    ("moe-gemm", r"_moe_gemm"),  # kernels/fused_moe.py
    ("moe-routing", r"[Ss]oftmax|topk|[Ss]ort|scatter_add|searchsorted|cumsum|[Ss]can"),
    ("rmsnorm", r"_rmsnorm"),
    ("rope", r"_rope"),
    ("silu", r"_silu"),
    ("sampler", r"_sample|argmax|gather"),
    ("kv-store", r"index_copy|indexFuncLarge|index_elementwise"),
    ("gemm", r"gemm|cutlass|nvjet|xmma|sm90|cublas|Kernel2"),
    ("nccl", r"nccl"),
    ("copy/cast", r"copy|elementwise|Memcpy|Memset|fill|cat"),
]


def bucket(decode: bool, bs: int) -> str:
    if not decode:
        return "prefill"
    for lo, hi in ((193, 256), (129, 192), (65, 128), (33, 64), (17, 32), (1, 16)):
        if lo <= bs <= hi:
            return f"decode {lo}-{hi}"
    return f"decode {bs}"


VARIANTS = (
    "base",
    "unfused",
    "logits-fp32",
    "decode-fa3",
    "prefill-fa3",
    "page32",
    "page64",
    "blaslt",
    "split-always",
    "fi-decode",
    "no-qkv",
    "item-order",
    "no-norm",
    "no-silu",
    "no-norm-silu",
    "no-qkv-silu",
    "no-fold",
    "no-runs",
    "runs-32",
    "pieces-16k",
    "budget-32k",
    "cuda-cores",
    "adds-first",
)


DEFAULT_BLAS = torch.backends.cuda.preferred_blas_library()
DEFAULT_RUN_PAGES = manager.RUN_PAGES
_QKV_STORE: Callable | None = None
_RMSNORM: Callable | None = None
_SILU: Callable | None = None


def _no_norm_in_decode(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """An ablation, wrong by design (timing only, as no-qkv), on the layers as they were before the norms' fold:
    decode batches skip every RMSNorm kernel, the residual add included. What folding the norms into the GEMMs next
    to them (the weight into the next GEMM's columns, the residual add into the previous GEMM as beta=1, 1/rms into
    the next small kernel) could save at most: +2.9% (sixty-first session)."""
    if x.reshape(-1, x.shape[-1]).shape[0] > 256:
        assert _RMSNORM is not None
        return _RMSNORM(x, weight, eps, residual)
    return x


def _no_silu_in_decode(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    """An ablation, wrong by design (timing only): decode batches skip the SiLU kernel, the down projection reads the
    gate half in place. What folding SiLU into the GEMMs around it could save at most."""
    if x.shape[0] > 256:
        assert _SILU is not None
        return _SILU(x, *args, **kwargs)
    return x[:, : x.shape[1] // 2]


def _no_qkv_in_decode(q: torch.Tensor, *args: object, **kwargs: object) -> None:
    """An ablation, wrong by design: decode batches (256 rows at most) skip the fused q/k/rope/KV kernel, so the
    attention reads unroped q and stale K/V; prefill runs it. Timing only: the offline workload ignores EOS, so its
    schedule does not depend on the tokens. What folding that kernel into the attention could save at most."""
    if q.shape[0] > 256:
        assert _QKV_STORE is not None
        _QKV_STORE(q, *args, **kwargs)


def apply_variant(name: str) -> dict:
    """Switch the variant's one change on (and every other off); returns EngineConfig fields it changes."""
    global _QKV_STORE, _RMSNORM, _SILU
    from engine import llm as engine_llm
    from engine.models import llama
    from kernels import triton_ops
    from kernels.attention import cuda_decode, flashinfer_backend, span_decode

    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}: choose one of {', '.join(VARIANTS)}")
    llama.FUSED_QKV = name != "unfused"
    llama.FOLD_NORMS = name not in ("no-fold", "no-norm", "no-norm-silu")
    manager.RUN_PAGES = {"no-runs": 1, "runs-32": 32}.get(name, DEFAULT_RUN_PAGES)
    flashinfer_backend.DECODE_KERNELS = "fa3" if name == "decode-fa3" else "fa2"
    flashinfer_backend.PREFILL_KERNELS = "fa3" if name == "prefill-fa3" else "fa2"
    flashinfer_backend.NO_SPLIT_WHEN_BALANCED = name != "split-always"
    flashinfer_backend.CUDA_DECODE = name != "fi-decode"
    # the CUDA decode's CTAs in item order with a KV head's items together (before the fifty-ninth session)
    span_decode.CUDA_HEADS_TOGETHER = name != "item-order"
    # the CUDA decode's products on the CUDA cores (before the sixty-sixth session)
    cuda_decode.TENSOR_CORES = name != "cuda-cores"
    engine_llm.ADD_AS_NEEDED = name != "adds-first"
    torch.backends.cuda.preferred_blas_library("cublaslt" if name == "blaslt" else DEFAULT_BLAS)
    _QKV_STORE = _QKV_STORE or triton_ops.qk_norm_rope_store
    triton_ops.qk_norm_rope_store = _no_qkv_in_decode if name in ("no-qkv", "no-qkv-silu") else _QKV_STORE
    _RMSNORM, _SILU = _RMSNORM or triton_ops.rmsnorm, _SILU or triton_ops.silu_and_mul
    no_norm, no_silu = name in ("no-norm", "no-norm-silu"), name in ("no-silu", "no-norm-silu", "no-qkv-silu")
    triton_ops.rmsnorm = _no_norm_in_decode if no_norm else _RMSNORM
    triton_ops.silu_and_mul = _no_silu_in_decode if no_silu else _SILU
    if name == "pieces-16k":  # the offline prefill's 16,384-token steps replay piecewise graphs too
        return {"piecewise_graph_tokens": 16384}
    if name == "budget-32k":
        return {"max_batch_tokens": 32768}
    return {"page_size": int(name[4:])} if name.startswith("page") else {}


def timed(run: Callable[[Batch], StepOutput], steps: list[tuple]) -> Callable[[Batch], StepOutput]:
    """`run` that appends (is_decode, batch size, tokens, start event, end event, launch CPU s, decode context tokens)
    to `steps`."""

    def timed_run(batch: Batch) -> StepOutput:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        t = time.perf_counter()
        out = run(batch)
        cpu = time.perf_counter() - t
        end.record()
        steps.append((batch.is_decode, len(batch.reqs), batch.num_tokens, start, end, cpu, batch.decode_context_tokens))
        return out

    return timed_run


def run_variant(model: str, name: str, kernels: bool) -> dict:
    changes = apply_variant(name)
    t0 = time.perf_counter()
    llm = LLM(EngineConfig(model=model, **{**OFFLINE_ENGINE, **changes}))  # as bench-offline runs
    startup = time.perf_counter() - t0
    if name == "logits-fp32":
        m = llm.engine.loaded.model
        orig_logits = m.logits
        m.logits = lambda h: orig_logits(h).float()  # type: ignore[method-assign]  # the variant under test
    cfg = llm.engine.model_cfg
    wl = random_workload(256, vocab_size=cfg.vocab_size)
    params = [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in wl.output_lens]
    warm = random_workload(16, (32, 64), (8, 16), seed=1, vocab_size=cfg.vocab_size)
    llm.generate(
        warm.prompts, [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in warm.output_lens]
    )

    runner = llm.engine.runner
    orig_run = runner.run
    steps: list[tuple] = []
    runner.run = timed(orig_run, steps)  # type: ignore[method-assign, assignment]  # time each step

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(wl.prompts, params)
    torch.cuda.synchronize()
    dur = time.perf_counter() - t0
    runner.run = orig_run  # type: ignore[method-assign]  # undo the timing wrapper
    tokens = sum(len(o.token_ids) for o in outs)

    # Each decode step's own floor: its bytes (the weights once, every running request's KV) at the copy bandwidth,
    # so a bucket shows how far above its bytes a step runs, and whether that excess scales with the KV or is fixed.
    bw = bandwidth_for(torch.cuda.get_device_name())
    w_bytes, kv_bytes = weight_bytes_per_step(cfg, 2), cfg.kv_bytes_per_token(2)
    agg: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    prev_end = None
    for decode, bs, _ntok, start, end, cpu, ctx in steps:
        a = agg[bucket(decode, bs)]
        a["steps"] += 1
        a["gpu_ms"] += start.elapsed_time(end)
        a["gap_ms"] += prev_end.elapsed_time(start) if prev_end is not None else 0.0
        a["launch_cpu_ms"] += cpu * 1e3
        a["requests"] += bs
        if decode and bw:
            a["floor_ms"] += (w_bytes + ctx * kv_bytes) / bw * 1e3
        prev_end = end
    buckets = {k: dict(v) for k, v in sorted(agg.items())}
    floor = gpu_floor([len(p) for p in wl.prompts], wl.output_lens, cfg, 2, llm.engine.device)
    res = dict(
        variant=name,
        model=model,
        output_tokens=tokens,
        duration=dur,
        output_throughput=tokens / dur,
        floor_fraction=tokens / dur / floor.output_throughput if floor else None,
        startup_seconds=startup,
        steps=len(steps),
        buckets=buckets,
        gpu_busy_s=sum(b["gpu_ms"] for b in buckets.values()) / 1e3,
        gpu_idle_s=sum(b["gap_ms"] for b in buckets.values()) / 1e3,
        cpu_ms_per_step={k: v / max(len(steps), 1) * 1e3 for k, v in llm.engine.timing.items()},
    )
    if kernels:
        res["kernels_ms"] = kernel_breakdown(llm, wl.prompts, params)
    llm.shutdown()
    del llm, runner, orig_run
    gc.collect()
    torch.cuda.empty_cache()
    return res


def kernel_breakdown(llm: LLM, prompts, params) -> dict[str, dict]:
    """Kernel time (ms) by category over one whole run of the workload (its own run: the profiler slows the CPU)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, params)
        torch.cuda.synchronize()
    cats: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    names: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", 0.0) or getattr(ev, "self_cuda_time_total", 0.0)
        if not us:
            continue
        cat = next((c for c, rx in KERNEL_KINDS if re.search(rx, ev.key)), "other")
        cats[cat] += us / 1e3
        counts[cat] += ev.count
        names[f"{cat}: {ev.key[:90]}"] += us / 1e3
    top = dict(sorted(names.items(), key=lambda kv: -kv[1])[:25])
    return {
        "by_category": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        "launches_by_category": dict(counts),
        "top_kernels": top,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    ap.add_argument("--variant", action="append", help=f"{' | '.join(VARIANTS)} (repeatable)")
    ap.add_argument("--kernels", action="store_true", help="also sum kernel time by category (each variant)")
    ap.add_argument("--out", default="step_profile.json")
    args = ap.parse_args()
    results = []
    for name in args.variant or ["base"]:
        r = run_variant(args.model, name, args.kernels)
        results.append(r)
        print(f"{name}: {r['output_throughput']:.0f} tok/s in {r['duration']:.2f} s", flush=True)
        with open(args.out, "w") as f:
            json.dump(
                {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f, indent=1
            )
    print(f"\n{'variant':<14}{'tok/s':>9}{'wall s':>8}{'of floor':>9}{'gpu busy s':>11}{'gpu idle s':>11}")
    for r in results:
        print(
            f"{r['variant']:<14}{r['output_throughput']:>9.0f}{r['duration']:>8.2f}{r['floor_fraction'] or 0:>9.3f}"
            f"{r['gpu_busy_s']:>11.2f}{r['gpu_idle_s']:>11.2f}"
        )
    base = results[0]
    print(
        f"\n{'steps of ' + base['variant']:<18}{'n':>6}{'gpu ms':>9}{'gpu ms/step':>12}{'gap ms':>9}"
        f"{'launch cpu ms/step':>19}{'floor ms/step':>14}{'over floor ms/step':>19}"
    )
    for k, b in base["buckets"].items():
        n = b["steps"]
        floor = f"{b['floor_ms'] / n:>14.2f}{(b['gpu_ms'] - b['floor_ms']) / n:>19.2f}" if "floor_ms" in b else ""
        print(
            f"{k:<18}{n:>6.0f}{b['gpu_ms']:>9.0f}{b['gpu_ms'] / n:>12.2f}{b['gap_ms']:>9.0f}"
            f"{b['launch_cpu_ms'] / n:>19.2f}{floor}"
        )
    for r in results:
        if "kernels_ms" in r:
            print(f"\nkernel ms by category, {r['variant']}:", json.dumps(r["kernels_ms"]["by_category"], indent=1))


if __name__ == "__main__":
    main()
