"""Prompts and sampling settings shared by the TP test and its torchrun worker."""

from __future__ import annotations

import random

from engine.sampling_params import SamplingParams

PARAMS: dict[str, SamplingParams | list[SamplingParams]] = {
    "greedy": SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
    "seeded": [
        SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=100 + i, ignore_eos=True) for i in range(6)
    ],
}


def prompts(model: str) -> list[list[int]]:
    rng = random.Random(0)
    vocab = 512 if "tiny" in model else 10000
    shared = [rng.randrange(vocab) for _ in range(24)]
    return [(shared if i % 2 else []) + [rng.randrange(vocab) for _ in range(rng.randint(4, 40))] for i in range(6)]
