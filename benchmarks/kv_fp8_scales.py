"""Would per-layer KV scales make an fp8 pool closer to bf16 on SmolLM2? (CPU, transformers; docs/gpu.md)

    ./run.sh python benchmarks/kv_fp8_scales.py

The embedded SmolLM2-135M in transformers (fp32), its attention fed K/V rounded to e4m3 at scale 1 (what
`--kv-cache-dtype fp8` stores) or at a per-layer scale amax * h / 448 (vLLM's `calculate_kv_scales` idea: the
largest value seen in calibration maps to 448 / h; with h negative, |h| and the scale rounded to a power of two),
calibrated on the greedy answers to two chat prompts and scored on six others: the mean |logprob change| of the
unrounded model's own greedy answer (32 tokens), and how many greedy answers change. Also each layer's K/V
magnitudes, and the share below e4m3's smallest normal (2^-6)."""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.model_source import embedded_default_path  # noqa: E402
from tests.conftest import make_llm  # noqa: E402
from tests.hf_reference import hf_greedy  # noqa: E402
from tests.test_hf_equivalence import PROMPTS  # noqa: E402

HEADROOMS = (1, 2, 8, 32, -1, -8, -32)  # negative: the same headroom, the scale rounded to a power of two


def main() -> None:
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    path = embedded_default_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    amax: dict[tuple[int, str], float] = {}
    small: dict[tuple[int, str], list[float]] = {}

    def record(module, q, k, v, *a, **kw):
        for name, t in (("k", k), ("v", v)):
            key = (module.layer_idx, name)
            amax[key] = max(amax.get(key, 0.0), float(t.abs().max()))
            small.setdefault(key, []).append(float((t.abs() < 2**-6).float().mean()))
        return sdpa_attention_forward(module, q, k, v, *a, **kw)

    def fp8(x: torch.Tensor, s: float) -> torch.Tensor:
        return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype) * s

    def rounded(h: float | None, module, q, k, v, *a, **kw):
        i = module.layer_idx
        sk, sv = (1.0, 1.0) if h is None else (amax[i, "k"] * abs(h) / 448, amax[i, "v"] * abs(h) / 448)
        if h is not None and h < 0:  # the scale rounded to a power of two: the grid of scale 1, shifted in range
            sk, sv = (2.0 ** round(math.log2(x)) for x in (sk, sv))
        return sdpa_attention_forward(module, q, fp8(k, sk), fp8(v, sv), *a, **kw)

    AttentionInterface.register("record", record)
    AttentionInterface.register("scale1", functools.partial(rounded, None))
    for h in HEADROOMS:
        AttentionInterface.register(f"amax{h}", functools.partial(rounded, h))
    llm = make_llm(None, max_running_requests=8)
    hf.config._attn_implementation = "sdpa"
    seqs = []
    for text in PROMPTS:
        prompt = llm.encode([{"role": "user", "content": text}])
        seqs.append((prompt, prompt + hf_greedy(hf, prompt, 32)[0]))

    def logprobs(seq: list[int], impl: str) -> torch.Tensor:
        hf.config._attn_implementation = impl
        with torch.no_grad():
            lp = hf(input_ids=torch.tensor([seq])).logits[0].float().log_softmax(-1)
        return lp[:-1].gather(1, torch.tensor(seq[1:])[:, None])[:, 0]

    for _, seq in seqs[:2]:
        logprobs(seq, "record")
    for (layer, name), m in sorted(amax.items()):
        print(f"layer {layer:2} {name}: amax {m:7.3f}, below 2^-6 {sum(small[layer, name]) / 2:.3f}")
    for impl in ["scale1"] + [f"amax{h}" for h in HEADROOMS]:
        drift = [float((logprobs(s, impl) - logprobs(s, "sdpa")).abs().mean()) for _, s in seqs[2:]]
        changed = 0
        for prompt, seq in seqs[2:]:
            hf.config._attn_implementation = impl
            changed += hf_greedy(hf, prompt, 32)[0] != seq[len(prompt) :]
        print(f"{impl:7} mean |logprob change| {[round(d, 3) for d in drift]}, greedy answers changed {changed} of 6")


if __name__ == "__main__":
    main()
