"""GPU correctness checks and offline throughput (issue: GPU fast path). Run on the GPU machine:

    source .whl/use-bundle.sh && python benchmarks/gpu_check.py --out $OUT/gpu_check.json

Prints a table last; the JSON holds every figure with the GPU, versions and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from minisgl_cli.roofline import gpu_floor
from minisgl_cli.workload import random_workload


def env() -> dict:
    import transformers

    try:
        import flashinfer

        fi = flashinfer.__version__
    except Exception as e:  # noqa: BLE001
        fi = f"missing ({e})"
    return dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        flashinfer=fi,
        transformers=transformers.__version__,
        commit=os.environ.get("MINISGL_COMMIT", "?"),
    )


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def traced(llm: LLM) -> list[torch.Tensor]:
    """Record every logits tensor the runner computes (one [n_sampled, V] per step)."""
    log: list[torch.Tensor] = []
    model = llm.engine.loaded.model
    orig = model.logits

    def logits(h):
        out = orig(h)
        log.append(out.detach().clone())
        return out

    model.logits = logits  # type: ignore[method-assign]  # record each step's logits
    return log


def free() -> None:
    import gc

    gc.collect()
    torch.cuda.empty_cache()


def make(model: str, **kw) -> LLM:
    return LLM(EngineConfig(model=model, **kw))


def check_backends(model: str) -> dict:
    """FlashInfer vs torch attention on the same weights: prefill, prefill on a cached prefix, decode."""
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, 10000, (512,), generator=g).tolist()
    prompts = [torch.randint(0, 10000, (n,), generator=g).tolist() for n in (37, 300, 700, 129)]
    follow = shared + torch.randint(0, 10000, (64,), generator=g).tolist()
    res: dict[str, object] = {}
    logs = {}
    for backend in ("torch", "flashinfer"):
        llm = make(model, attention_backend=backend, cuda_graph_max_bs=0, overlap=False, kv_cache_gb=8)
        log = traced(llm)
        p = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        toks = [o.token_ids for o in llm.generate(prompts + [shared], p)]
        hit = llm.generate([follow], p)[0]
        logs[backend] = (log, toks, hit.cache_hit_tokens)
        del llm
        free()
    (lt, tt, ht), (lf, tf, hf) = logs["torch"], logs["flashinfer"]
    res["prefill_rel_err"] = max(rel_err(a, b) for a, b in zip(lf[0], lt[0]))
    # Decode rows are comparable only while both runs fed the same tokens (bf16 near-ties may flip a greedy pick).
    decode_errs = [rel_err(lf[s][i], lt[s][i]) for s in range(1, 6) for i in range(5) if tt[i][:s] == tf[i][:s]]
    res["decode_rel_err_max"] = max(decode_errs)
    res["decode_rows_compared"] = len(decode_errs)
    res["prefix_prefill_rel_err"] = rel_err(lf[-6], lt[-6])
    res["prefix_hit_tokens"] = [ht, hf]
    res["greedy_tokens_equal"] = tt == tf
    return res


def check_vs_transformers(model: str) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    llm = make(model, cuda_graph_max_bs=0, kv_cache_gb=8)
    log = traced(llm)
    cfg = llm.engine.model_cfg
    d = cfg.to_hf_dict()
    hf_cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    hf = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.bfloat16).cuda().eval()
    hf.load_state_dict(llm.engine.loaded.model.hf_state_dict(), strict=False)
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 10000, (n,), generator=g).tolist() for n in (16, 200, 900)]
    hf32 = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).cuda().eval()
    hf32.load_state_dict({k: v.float() for k, v in hf.state_dict().items()}, strict=False)
    if cfg.tie_word_embeddings:
        hf32.tie_weights()
    ours, theirs = [], []
    for p in prompts:
        log.clear()
        llm.generate([p], SamplingParams(max_tokens=1, temperature=0))
        with torch.no_grad():
            ids = torch.tensor([p], device="cuda")
            ref = hf(ids).logits[0, -1]
            ref32 = hf32(ids).logits[0, -1]
        ours.append({"vs_hf_bf16": rel_err(log[0][0], ref), "vs_hf_fp32": rel_err(log[0][0], ref32)})
        theirs.append(rel_err(ref, ref32))
    del hf, hf32, llm
    free()
    # bf16 noise calibration: how far HF's own bf16 run is from fp32 on the same weights.
    return {"engine_logits_rel_err": ours, "hf_bf16_vs_fp32_rel_err": theirs}


def check_graphs_overlap(model: str) -> dict:
    g = torch.Generator().manual_seed(2)
    prompts = [
        torch.randint(0, 10000, (int(n),), generator=g).tolist() for n in torch.randint(50, 400, (48,), generator=g)
    ]
    p = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    out = {}
    base = None
    for graphs in (True, False):
        for overlap in (True, False):
            llm = make(model, cuda_graph_max_bs=64 if graphs else 0, overlap=overlap, kv_cache_gb=8)
            toks = [o.token_ids for o in llm.generate(prompts, p)]
            name = f"graphs={'on' if graphs else 'off'},overlap={'on' if overlap else 'off'}"
            base = base or toks
            out[name] = sum(a != b for a, b in zip(toks, base))  # requests whose tokens differ from the first
            del llm
            free()
    return {"requests_differing_from_graphs_on_overlap_on": out}


def bench(model: str, num_seqs: int = 256, **kw) -> dict:
    t0 = time.perf_counter()
    llm = make(model, **kw)
    startup = time.perf_counter() - t0
    cfg = llm.engine.model_cfg
    wl = random_workload(num_seqs, vocab_size=cfg.vocab_size)
    warm = random_workload(16, (32, 64), (8, 16), seed=1, vocab_size=cfg.vocab_size)
    llm.generate(
        warm.prompts, [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in warm.output_lens]
    )
    llm.engine.timing = dict(schedule=0.0, launch=0.0, process=0.0)
    steps0 = llm.engine.stats["steps"]
    params = [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in wl.output_lens]
    torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(wl.prompts, params)
    torch.cuda.synchronize()
    dur = time.perf_counter() - t
    out_tokens = sum(len(o.token_ids) for o in outs)
    floor = gpu_floor([len(p) for p in wl.prompts], wl.output_lens, cfg, 2, llm.engine.device)
    steps = llm.engine.stats["steps"] - steps0
    timing = {k: v / steps * 1e3 for k, v in llm.engine.timing.items()}
    res = dict(
        model=model,
        num_seqs=num_seqs,
        total_output_tokens=out_tokens,
        total_input_tokens=wl.input_tokens,
        duration=dur,
        output_throughput=out_tokens / dur,
        floor_output_throughput=floor.output_throughput if floor else None,
        floor_fraction=(out_tokens / dur) / floor.output_throughput if floor else None,
        steps=steps,
        cpu_ms_per_step=timing,
        startup_seconds=startup,
        graph_capture_seconds=llm.engine.runner.graph_capture_seconds,
        kv_pages=llm.engine.cache.num_pages,
        page_size=llm.engine.cache.page_size,
        preemptions=llm.metrics().preemptions,
    )
    res["profile"] = profile_decode(llm, wl) if os.environ.get("MINISGL_PROFILE") else None
    del llm
    free()
    return res


def profile_decode(llm: LLM, wl) -> str:
    """CUDA kernel time by name over a few decode steps at full batch."""
    from torch.profiler import ProfilerActivity, profile

    for p, n in zip(wl.prompts, wl.output_lens):
        llm.add_request(p, SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True))
    while llm.engine.scheduler.waiting or llm.engine.scheduler.prefilling:
        llm.step()
    for _ in range(5):
        llm.step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            llm.step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)
    while llm.has_work():
        llm.step()
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--skip", default="", help="comma list: backends,hf,graphs,qwen,llama")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    res: dict = {"env": env()}
    print(res["env"], flush=True)
    q = "dummy:Qwen3-0.6B"
    steps = [
        ("backends", lambda: check_backends(q)),
        ("hf", lambda: check_vs_transformers(q)),
        ("graphs", lambda: check_graphs_overlap(q)),
        ("qwen", lambda: bench(q)),
        ("llama", lambda: bench("dummy:Llama-3.1-8B")),
    ]
    for name, fn in steps:
        if name in skip:
            continue
        t = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as e:  # keep going: one failure should not cost the whole device run
            import traceback

            traceback.print_exc()
            res[name] = {"error": f"{type(e).__name__}: {e}"}
        res[name + "_wall_s"] = time.perf_counter() - t
        prof = res[name].pop("profile", None) if isinstance(res[name], dict) else None
        if prof:
            print(prof)
            res[name + "_profile"] = prof
        print(name, json.dumps(res[name], indent=1), flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
