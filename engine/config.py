"""Engine settings: one frozen dataclass, validated once; every front end builds one of these. Its field defaults are
the CLI's too (minisgl_cli/options.py), so the module imports torch only where a method needs it: `minisgl --help`
stays free of it."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _backend_ok(name: str) -> bool:
    from kernels.attention.base import parse_backend

    try:
        parse_backend(name)
    except ValueError:
        return False
    return True


# A field's annotation (a string here: `from __future__ import annotations`) -> the types its values may have.
_KINDS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_types(config: EngineConfig) -> None:
    """The Python API has no CLI parser in front: page_size=1.5 failed later with an unclear TypeError, and
    overlap="yes" or check_invariants="no" were taken as true."""
    for f in fields(config):
        value, kinds = getattr(config, f.name), [k.strip() for k in str(f.type).split("|")]
        if value is None and "None" in kinds:
            continue
        allowed = tuple(t for k in kinds if k != "None" for t in _KINDS.get(k, (object,)))
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ValueError(f"{f.name} must be {' or '.join(kinds)} (got {value!r})")


PIECEWISE_GRAPH_TOKENS = 4096
# With mixed batches, a step in which requests decode adds at most this many prefill tokens: each arriving chunk
# lengthens every running stream's step. Chosen on issue #15's saturated replay (docs/scheduling.md, one H100):
# 1024 against 8192 gave 1.04x the output, 0.56x the TTFT p50 and 0.60x the TBT p99.
MIXED_PREFILL_TOKENS = 1024
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # fp8 is e4m3, as in vLLM
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs (OpenAI's top_logprobs limit)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str | None = None  # None: the embedded default; a HF dir, a .gguf file, or dummy:<preset>
    device: str = "auto"  # auto | cpu | cuda[:n]
    dtype: str = "auto"  # auto (GPU: bf16; CPU: engine.cpu.auto_dtype) | float32 | bfloat16 | float16
    page_size: int = 16
    num_pages: int | None = None  # overrides the memory budget below
    kv_cache_gb: float | None = None  # KV pool budget; default: 1 GiB on CPU, memory_fraction of free GPU memory
    # KV pool storage: auto (the model's dtype) | fp8 (e4m3, scale 1; kvcache/pool.py)
    kv_cache_dtype: str = "auto"
    memory_fraction: float = 0.85
    max_running_requests: int = 256
    max_batch_tokens: int = 8192  # per-step token budget (decode tokens + prefill chunks); long prompts are chunked
    # One step carries every running request's decode token plus prefill chunks (off: prefill steps first). On by
    # default since two same-session H200 runs through `serve` (docs/scheduling.md): the 5x trace replay 1.11-1.14x
    # the output, 0.07-0.21x the TTFT p50, half the ITL p99; bench-offline 0.99x.
    mixed_batch: bool = True
    # prefill tokens per step while requests decode (mixed batches); None: up to max_batch_tokens, as with none decoding
    mixed_prefill_tokens: int | None = MIXED_PREFILL_TOKENS
    # Admission stops while the running requests' contexts hold this many tokens: a decode step reads all of their KV,
    # so this bounds the inter-token gap under load (None: only the KV pool and max_running_requests bound it).
    max_running_tokens: int | None = None
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    radix_cache: bool = True
    attention_backend: str = "auto"  # auto | torch | flashinfer | fa, or PREFILL,DECODE (e.g. fa,flashinfer)
    cuda_graph_max_bs: int = 256  # 0 disables CUDA graphs
    # Prefill and mixed steps of up to this many tokens replay CUDA graphs captured in pieces between the attention
    # calls (engine/piecewise_graph.py; FlashInfer only); 0 disables them.
    piecewise_graph_tokens: int = PIECEWISE_GRAPH_TOKENS
    overlap: bool | None = None  # default: on for CUDA
    tp: int = 1
    seed: int = 0
    # the most log-probabilities a request may ask per token (logprobs, prompt_logprobs), vLLM's setting of that name;
    # -1: the whole vocabulary
    max_logprobs: int = MAX_LOGPROBS
    check_invariants: bool = False  # assert page accounting after every step (tests)

    def __post_init__(self) -> None:
        _check_types(self)
        checks = [
            (self.model is None or self.model != "", "model", "must name a model (None: the embedded default)"),
            (-(2**63) <= self.seed < 2**64, "seed", "must be a 64-bit integer"),
            (
                re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None,
                "device",
                "must be auto, cpu, cuda or cuda:N",
            ),
            (self.page_size >= 1, "page_size", "must be >= 1"),
            (self.num_pages is None or self.num_pages >= 2, "num_pages", "must be >= 2"),
            (self.kv_cache_gb is None or self.kv_cache_gb > 0, "kv_cache_gb", "must be > 0"),
            (self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype", "must be auto, fp8 or fp8_e4m3"),
            (0 < self.memory_fraction <= 1, "memory_fraction", "must be in (0, 1]"),
            (self.max_running_requests >= 1, "max_running_requests", "must be >= 1"),
            (self.max_batch_tokens >= 1, "max_batch_tokens", "must be >= 1"),
            (
                self.mixed_prefill_tokens is None or self.mixed_prefill_tokens >= 1,
                "mixed_prefill_tokens",
                "must be >= 1",
            ),
            (self.max_running_tokens is None or self.max_running_tokens >= 1, "max_running_tokens", "must be >= 1"),
            (self.max_model_len is None or self.max_model_len >= 2, "max_model_len", "must be >= 2"),
            (
                _backend_ok(self.attention_backend),
                "attention_backend",
                "must be one of auto, torch, flashinfer, fa, or PREFILL,DECODE of two of them (e.g. fa,flashinfer)",
            ),
            (self.cuda_graph_max_bs >= 0, "cuda_graph_max_bs", "must be >= 0"),
            (self.piecewise_graph_tokens >= 0, "piecewise_graph_tokens", "must be >= 0"),
            (self.tp >= 1, "tp", "must be >= 1"),
            (self.max_logprobs >= -1, "max_logprobs", "must be >= 0, or -1 for the whole vocabulary"),
            (
                self.dtype in ("auto", "float32", "bfloat16", "float16"),
                "dtype",
                "must be one of auto, float32, bfloat16, float16",
            ),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"{name} {why} (got {getattr(self, name)!r})")

    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dev = torch.device(self.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for, but CUDA is not available")
        return dev

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            if device.type == "cuda":
                return torch.bfloat16
            from engine.cpu import auto_dtype
            from engine.model_source import resolve

            try:
                gguf = resolve(self.model)[0] == "gguf"
            except (ValueError, FileNotFoundError):  # reported where the model loads
                gguf = False
            return auto_dtype(gguf)
        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype

    def torch_kv_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The KV pool's stored dtype for a model computing in `dtype`."""
        import torch

        return dtype if self.kv_cache_dtype == "auto" else torch.float8_e4m3fn

    def use_overlap(self, device: torch.device) -> bool:
        return device.type == "cuda" if self.overlap is None else self.overlap
