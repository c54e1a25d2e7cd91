"""The `auto` dtype: bf16 on GPU and on CPUs with native bf16, fp32 elsewhere and for GGUF models on a CPU (their
quantized blocks run in fp32); --dtype and the env var override."""

from __future__ import annotations

import pytest
import torch

from engine import cpu
from engine.config import EngineConfig

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("native, want", [(True, torch.bfloat16), (False, torch.float32)])
def test_cpu_auto_follows_native_bf16(monkeypatch, native, want):
    monkeypatch.delenv(cpu.DTYPE_ENV, raising=False)
    monkeypatch.setattr(cpu, "native_bf16", lambda: native)
    tiny = "dummy:tiny-llama"
    assert EngineConfig(model=tiny).torch_dtype(CPU) == want
    assert EngineConfig(model=tiny).torch_dtype(CUDA) == torch.bfloat16  # the GPU default never changes
    assert EngineConfig(model=tiny, dtype="float32").torch_dtype(CPU) == torch.float32
    assert EngineConfig(model=tiny, dtype="bfloat16").torch_dtype(CPU) == torch.bfloat16
    # the embedded GGUF model: fp32 on any CPU, bf16 on the GPU, --dtype still wins
    assert EngineConfig().torch_dtype(CPU) == torch.float32
    assert EngineConfig().torch_dtype(CUDA) == torch.bfloat16
    assert EngineConfig(dtype="bfloat16").torch_dtype(CPU) == torch.bfloat16


def test_env_pins_the_cpu_auto_dtype(monkeypatch):
    monkeypatch.setattr(cpu, "native_bf16", lambda: True)
    monkeypatch.setenv(cpu.DTYPE_ENV, "float32")
    assert EngineConfig(model="dummy:tiny-llama").torch_dtype(CPU) == torch.float32
    monkeypatch.setenv(cpu.DTYPE_ENV, "bfloat16")
    assert EngineConfig().torch_dtype(CPU) == torch.bfloat16
    monkeypatch.setenv(cpu.DTYPE_ENV, "float32")
    assert EngineConfig().torch_dtype(CUDA) == torch.bfloat16
    monkeypatch.setenv(cpu.DTYPE_ENV, "float64")
    with pytest.raises(ValueError, match="MINISGL_CPU_DTYPE must be float32 or bfloat16"):
        EngineConfig().torch_dtype(CPU)


def test_native_bf16_reads_the_cpu_flags(monkeypatch, tmp_path):
    flags = tmp_path / "cpuinfo"
    for text, want in [
        ("flags : avx2 avx512f avx512_bf16", True),
        ("flags : avx2 amx_bf16", True),
        ("flags : avx2", False),
    ]:
        flags.write_text(text)
        monkeypatch.setattr(cpu, "_CPUINFO", flags)
        cpu.native_bf16.cache_clear()
        assert cpu.native_bf16() is want
    cpu.native_bf16.cache_clear()
