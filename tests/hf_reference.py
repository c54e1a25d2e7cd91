"""Hugging Face transformers as the reference: build it from our config/weights, decode greedily."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from engine.model_config import ModelConfig


def hf_model_from_config(cfg: ModelConfig, seed: int = 0, std: float = 0.25):
    """A random HF model at cfg's shapes, with weights large enough that greedy choices are not near-ties."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = cfg.to_hf_dict()
    hf_cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(seed)
    return randomize(AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).eval(), seed, std)


def randomize(model, seed: int = 0, std: float = 0.25):
    """Weights large enough that greedy choices are not near-ties (norms near 1, everything else N(0, std))."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, std)
    return model


def save_hf(model, path: Path) -> Path:
    model.save_pretrained(str(path), safe_serialization=True)
    return path


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation with HF's own KV cache; also returns the first step's logits."""
    # transformers 5.2x calls the KV cache `cache` (`past_key_values`, deprecated, goes in 5.40); 5.17 (the GPU
    # machine's) `past_key_values`
    kv = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = torch.tensor([prompt])
    out = model(input_ids=ids, use_cache=True)
    first = out.logits[0, -1].float()
    past, tokens = getattr(out, kv), []
    nxt = int(first.argmax())
    for _ in range(n):
        tokens.append(nxt)
        if len(tokens) == n:
            break
        out = model(input_ids=torch.tensor([[nxt]]), use_cache=True, **{kv: past})
        past = getattr(out, kv)
        nxt = int(out.logits[0, -1].argmax())
    return tokens, first
