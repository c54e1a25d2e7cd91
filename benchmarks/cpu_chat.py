"""The embedded chat on a CPU (issue #24): single-stream decode against HF `generate`, the batch benchmark against
transformers, start-up to the chat prompt (cold and cached), and bf16 answers beside fp32. Prints numbers and
writes them to --json; it asserts nothing (docs/benchmarks.md keeps the record).

    ./run.sh python benchmarks/cpu_chat.py --json benchmarks/results/cpu_chat.json
    ./run.sh python benchmarks/cpu_chat.py --model dummy:SmolLM2-135M --skip startup,batch,answers

Single stream: one greedy chat answer of --tokens tokens (EOS ignored) after a warm-up, minisgl and HF interleaved
--repeats times; medians. HF runs `generate` on the same weights (its own GGUF reader for the embedded model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPT = [{"role": "user", "content": "Why is the sky blue?"}]


def single_stream(model: str | None, dtype: str, tokens: int, repeats: int) -> dict:
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams
    from minisgl_cli.hf_peer import load_hf_model

    llm = LLM(model=model, device="cpu", dtype=dtype)
    ids = llm.encode(PROMPT) if llm.tokenizer.has_chat_template else list(range(1, 30))
    sp = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    hf = load_hf_model(model, torch.device("cpu"), llm.engine.dtype)
    x = torch.tensor([ids])
    gen = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False, "pad_token_id": 0}
    llm.generate([ids], SamplingParams(max_tokens=8, temperature=0))
    with torch.inference_mode():
        hf.generate(x, max_new_tokens=8, do_sample=False, pad_token_id=0)
    ours, theirs, tbt = [], [], []
    for _ in range(repeats):
        t = time.perf_counter()
        out = llm.generate([ids], sp)[0]
        ours.append(tokens / (time.perf_counter() - t))
        tbt.append(statistics.median(out.itls) * 1000)
        with torch.inference_mode():
            t = time.perf_counter()
            hf.generate(x, **gen)
            theirs.append(tokens / (time.perf_counter() - t))
    r: dict[str, object] = {
        "dtype": str(llm.engine.dtype).removeprefix("torch."),
        "minisgl_tok_s": statistics.median(ours),
        "minisgl_tbt_p50_ms": statistics.median(tbt),
        "hf_generate_tok_s": statistics.median(theirs),
        "runs_minisgl": ours,
        "runs_hf": theirs,
    }
    r["speedup"] = statistics.median(ours) / statistics.median(theirs)
    llm.engine.shutdown()
    return r


def startup(dtype: str, runs: int) -> list[float]:
    """Seconds from launching `minisgl chat --no-tui` to its banner (it reads stdin next), with a fresh weight
    cache: the first run fills it, the later ones read it."""
    times = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, MINISGL_CACHE_DIR=cache, MINISGL_WEIGHT_CACHE="1")
        for _ in range(runs):
            t = time.perf_counter()
            p = subprocess.Popen(
                [sys.executable, "-m", "minisgl_cli", "chat", "--no-tui", "--device", "cpu", "--dtype", dtype],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            assert p.stderr is not None and p.stdin is not None
            for line in p.stderr:
                if line.startswith("minisgl chat ·"):
                    times.append(time.perf_counter() - t)
                    break
            p.stdin.close()
            p.wait(timeout=120)
    return times


def batch(model: str | None, dtype: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, "-m", "minisgl_cli", "bench-offline", "--device", "cpu", "--dtype", dtype]
        cmd += ["--model", model] if model else []
        cmd += ["--num-seqs", "16", "--input-len", "32:128", "--output-len", "16:64", "--compare", "--quiet"]
        subprocess.run(cmd + ["--json", f.name], check=True, stdout=subprocess.DEVNULL)
        r = json.loads(Path(f.name).read_text())
    return {
        "minisgl_tok_s": r["output_throughput"],
        "transformers_tok_s": r["peer"]["output_throughput"],
        "speedup": r["speedup"],
    }


def answers(tokens: int) -> dict:
    """Greedy answers to the test suite's held prompts in bf16 beside fp32: identical tokens, or where they part."""
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams
    from tests.test_hf_equivalence import PROMPTS

    sp = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    outs = {}
    for dtype in ("float32", "bfloat16"):
        llm = LLM(model=None, device="cpu", dtype=dtype)
        outs[dtype] = llm.generate([[{"role": "user", "content": p}] for p in PROMPTS], sp)
        llm.engine.shutdown()
    rows = []
    for p, a, b in zip(PROMPTS, outs["float32"], outs["bfloat16"]):
        same = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
        rows.append(
            {
                "prompt": p,
                "identical": same == len(a.token_ids),
                "first_difference": same,
                "fp32": a.text,
                "bf16": b.text,
            }
        )
    return {"identical": sum(r["identical"] for r in rows), "prompts": len(rows), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--dtypes", default="auto", help="comma-separated: auto,float32,bfloat16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: single,startup,batch,answers")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    skip = set(filter(None, a.skip.split(",")))
    from engine.cpu import native_bf16

    res: dict = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": native_bf16(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average": os.getloadavg(),
    }
    for dtype in a.dtypes.split(","):
        part = res.setdefault(dtype, {})
        if "single" not in skip:
            part["single_stream"] = s = single_stream(a.model, dtype, a.tokens, a.repeats)
            print(
                f"[{dtype}->{s['dtype']}] single stream: minisgl {s['minisgl_tok_s']:.1f} tok/s "
                f"(TBT p50 {s['minisgl_tbt_p50_ms']:.1f} ms), HF generate {s['hf_generate_tok_s']:.1f} tok/s, "
                f"{s['speedup']:.2f}x",
                flush=True,
            )
        if "startup" not in skip and a.model is None:
            part["startup_s"] = t = startup(dtype, 2)
            print(f"[{dtype}] start-up to the chat prompt: first {t[0]:.1f} s, cached {t[1]:.1f} s", flush=True)
        if "batch" not in skip:
            part["batch"] = b = batch(a.model, dtype)
            print(
                f"[{dtype}] bench-offline --compare: minisgl {b['minisgl_tok_s']:.1f} tok/s, transformers "
                f"{b['transformers_tok_s']:.1f} tok/s, {b['speedup']:.2f}x",
                flush=True,
            )
    if "answers" not in skip and a.model is None:
        res["answers"] = r = answers(32)
        print(f"bf16 vs fp32 greedy answers: {r['identical']}/{r['prompts']} identical over 32 tokens")
        for row in r["rows"]:
            if not row["identical"]:
                print(f"  {row['prompt']!r} parts at token {row['first_difference']}: bf16 {row['bf16']!r}")
    res["load_average_after"] = os.getloadavg()
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
