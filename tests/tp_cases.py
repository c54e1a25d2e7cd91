"""Prompts and sampling settings shared by the TP test and its torchrun worker."""

from __future__ import annotations

import random
from typing import Any

from engine.sampling_params import SamplingParams

# A small pool: check_invariants walks every page after every step (with the default 1 GiB pool a tiny model has
# ~500k pages and that walk took ~95% of the run).
ENGINE: dict[str, Any] = dict(device="cpu", check_invariants=True, page_size=4, num_pages=512)

PARAMS: dict[str, SamplingParams | list[SamplingParams]] = {
    "greedy": SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
    "seeded": [
        SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=100 + i, ignore_eos=True) for i in range(6)
    ],
}


def prompts(model: str) -> list[list[int]]:
    rng = random.Random(0)
    vocab = 512 if "tiny" in model else 10000
    shared = [rng.randrange(vocab) for _ in range(24)]
    return [(shared if i % 2 else []) + [rng.randrange(vocab) for _ in range(rng.randint(4, 40))] for i in range(6)]
