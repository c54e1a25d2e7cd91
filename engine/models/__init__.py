"""Model registry keyed by the Hugging Face `architectures` name."""

from __future__ import annotations

from engine.model_config import ModelConfig
from engine.models.llama import LlamaForCausalLM, Qwen3ForCausalLM

MODELS: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def create_model(cfg: ModelConfig) -> LlamaForCausalLM:
    cls = MODELS.get(cfg.architecture)
    if cls is None:
        raise ValueError(f"unsupported architecture {cfg.architecture!r}; supported: {', '.join(MODELS)}")
    return cls(cfg)
