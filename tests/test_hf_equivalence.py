"""Greedy tokens identical to Hugging Face transformers on the same weights (fp32, CPU)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.model_config import PRESETS
from engine.sampling_params import SamplingParams
from tests.conftest import make_llm
from tests.hf_reference import hf_greedy, hf_model_from_config, save_hf

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Name a famous painter.",
    "Why is the sky blue?",
]


def test_smollm_matches_transformers(smollm, hf_smollm):
    prompts = [smollm.encode([{"role": "user", "content": p}]) for p in PROMPTS]
    outs = smollm.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        ref, _ = hf_greedy(hf_smollm, prompt, 32)
        assert out.token_ids == ref, (smollm.tokenizer.decode(out.token_ids), smollm.tokenizer.decode(ref))
    paris = outs[0].text
    assert "Paris" in paris, paris  # and the weights are the real ones, not merely the same wrong ones


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_tiny_random_matches_transformers(preset, tmp_path):
    hf = hf_model_from_config(PRESETS[preset])
    save_hf(hf, tmp_path / preset)
    llm = make_llm(str(tmp_path / preset), page_size=4, num_pages=256)  # small: the page check is O(pages)
    llm.engine.runner.keep_logits = True
    rng = random.Random(1)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(5, 40))] for _ in range(6)]
    for prompt in prompts:
        ref, ref_logits = hf_greedy(hf, prompt, 24)
        out = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
        assert out.token_ids == ref
    # Logits too, on a batch: the last request's first-step logits equal HF's within fp32 noise.
    rid = llm.add_request(prompts[0], SamplingParams(max_tokens=1, temperature=0))
    while llm.has_work():
        llm.step()
    _, ref_logits = hf_greedy(hf, prompts[0], 1)
    torch.testing.assert_close(llm.engine.runner.last_logits[0], ref_logits, rtol=1e-4, atol=1e-4)
    assert rid


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    """Llama-3.x rope scaling (llama3 type) on a tiny config."""
    from dataclasses import replace

    cfg = replace(
        PRESETS["tiny-llama"],
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        rope_theta=500000.0,
    )
    hf = hf_model_from_config(cfg, seed=3)
    save_hf(hf, tmp_path / "l3")
    llm = make_llm(str(tmp_path / "l3"))
    prompt = list(range(10, 110))  # long enough that low-frequency scaling matters
    out = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    assert out.token_ids == hf_greedy(hf, prompt, 16)[0]
