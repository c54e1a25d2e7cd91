"""Model registry keyed by the Hugging Face `architectures` name: one decoder, configured by ModelConfig's flags."""

from __future__ import annotations

from engine.model_config import HF_MODEL_TYPES, ModelConfig
from engine.models.llama import LlamaForCausalLM

MODELS: dict[str, type[LlamaForCausalLM]] = dict.fromkeys(HF_MODEL_TYPES, LlamaForCausalLM)


def create_model(cfg: ModelConfig) -> LlamaForCausalLM:
    cls = MODELS.get(cfg.architecture)
    if cls is None:
        raise ValueError(f"unsupported architecture {cfg.architecture!r}; supported: {', '.join(MODELS)}")
    return cls(cfg)
