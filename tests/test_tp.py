"""Tensor parallelism on CPU (gloo): TP=2 and TP=3 give the same tokens as TP=1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.llm import LLM
from tests.tp_cases import PARAMS, prompts

ROOT = Path(__file__).resolve().parent.parent


def tp_run(model: str, n: int, tmp_path: Path) -> dict:
    out = tmp_path / f"tp{n}.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MINISGL_DIST_TIMEOUT="120")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--standalone",
           str(ROOT / "tests" / "tp_generate.py"), model, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def tp1(model: str) -> dict:
    llm = LLM(EngineConfig(model=model, device="cpu", check_invariants=True, page_size=4))
    return {name: [o.token_ids for o in llm.generate(prompts(model), p)] for name, p in PARAMS.items()}


@pytest.mark.parametrize("model,n", [("dummy:tiny-llama", 2), (None, 3)], ids=["tiny-llama-tp2", "smollm2-tp3"])
def test_tensor_parallel_matches_single_process(model, n, tmp_path):
    model_arg = model or str(__import__("engine.weights", fromlist=["x"]).embedded_default_path())
    expected = tp1(model_arg)
    got = tp_run(model_arg, n, tmp_path)
    assert got["greedy"] == expected["greedy"]
    assert got["seeded"] == expected["seeded"]  # rank 0 samples and broadcasts: no divergence under sampling


def test_tp_size_must_match_world_and_divide_heads():
    with pytest.raises(ValueError, match="torchrun --nproc-per-node 2"):
        LLM(EngineConfig(model="dummy:tiny-llama", device="cpu", tp=2))
