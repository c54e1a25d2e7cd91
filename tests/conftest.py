"""Shared fixtures: the real embedded model (session-wide), tiny random models, GPU skipping."""
from __future__ import annotations

import os

import pytest
import torch

from engine.config import EngineConfig
from engine.llm import LLM

# One intra-op thread: the suite runs engine threads, servers and UIs beside the test thread on 2 cores, where
# OpenMP workers spinning for a core slowed tiny-model steps ~45x (0.025 s vs 1.1 s) and starved the TUI tests.
torch.set_num_threads(int(os.environ.get("MINISGL_TEST_THREADS", "1")))


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_slow = pytest.mark.skip(reason="slow: set MINISGL_SLOW=1")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not os.environ.get("MINISGL_SLOW"):
            item.add_marker(skip_slow)


def make_llm(model: str = "dummy:tiny-llama", **kw) -> LLM:
    """A CPU engine that checks page accounting after every step."""
    kw.setdefault("device", "cpu")
    kw.setdefault("check_invariants", True)
    return LLM(EngineConfig(model=model, **kw))


@pytest.fixture(scope="session")
def smollm() -> LLM:
    """The embedded SmolLM2-135M-Instruct (real weights, real tokenizer), fp32 on CPU."""
    return make_llm(None, max_running_requests=32)
