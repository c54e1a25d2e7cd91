"""The memory-bandwidth floor of an offline workload (docs/benchmarks.md, "The floor").

Every decode step must read, at least once, the weights and the KV cache of every running request. With all
requests running from the start the workload needs max(output_len) - 1 decode steps; request i's decode step j
(1 <= j < out_i) reads its in_i + j cached tokens. The time to move those bytes at the GPU's copy bandwidth is
a lower bound on the wall time (prefill and the matmul work come on top), hence an upper bound on tok/s.

Mixture-of-experts models: a step's tokens may all route to the same experts, so what every decode step must read
is the dense weights plus, in each sparse layer, the router and num_experts_per_tok experts (the "active"
parameters; Qwen3-30B-A3B: 3.3 of 30.5 B). That is the floor. Real batches spread over many more experts (with
uniform routing a batch of B tokens touches E * (1 - (1 - k/E)^B) of E experts: ~all 128 of Qwen3-30B-A3B from
B = 64 on), so the floor also reports, for reference, the time with that expected count per step
(`seconds_uniform_routing`); it is not a bound."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.model_config import ModelConfig

# Measured device-to-device copy bandwidth (torch copies of GiBs on each GPU: docs/gpu.md), bytes/s; matched
# against torch.cuda.get_device_name().
GPU_BANDWIDTH = {"H200": 4.3e12, "H100": 3.0e12}


@dataclass(frozen=True, slots=True)
class Floor:
    gpu: str
    bandwidth: float  # bytes/s, all tensor-parallel GPUs together
    kv_bytes: float
    weight_bytes: float
    decode_steps: int
    seconds: float
    output_throughput: float  # tok/s at the floor
    seconds_uniform_routing: float | None = None  # MoE only: experts read as uniform routing would spread them

    def as_dict(self) -> dict:
        return asdict(self)


def bandwidth_for(device_name: str) -> float | None:
    return next((bw for key, bw in GPU_BANDWIDTH.items() if key in device_name), None)


def weight_bytes_per_step(cfg: ModelConfig, dtype_bytes: int, experts_per_layer: float | None = None) -> int:
    """Weights read by one forward pass: every matrix once, the LM head in full, the embedding only by rows; in a
    MoE layer the router and `experts_per_layer` experts (default: num_experts_per_tok, the fewest a step can use)."""
    h = cfg.hidden_size
    k = cfg.num_experts_per_tok if experts_per_layer is None else experts_per_layer
    params = cfg.num_layers * cfg.attention_params() + cfg.mlp_params(k) + h + cfg.vocab_size * h
    return round(params * dtype_bytes)


def decode_floor(
    input_lens: Sequence[int],
    output_lens: Sequence[int],
    cfg,
    dtype_bytes: int,
    gpu: str,
    bandwidth: float,
    kv_dtype_bytes: int | None = None,  # the KV cache's element size, if not dtype_bytes (an fp8 cache: 1)
) -> Floor:
    kv_tokens = sum((o - 1) * i + (o - 1) * o // 2 for i, o in zip(input_lens, output_lens))
    kv = float(kv_tokens * cfg.kv_bytes_per_token(kv_dtype_bytes or dtype_bytes))
    steps = max(output_lens, default=1) - 1
    w = float(steps * weight_bytes_per_step(cfg, dtype_bytes))
    seconds = (kv + w) / bandwidth
    uniform = None
    if cfg.num_experts:  # step j (1-based) decodes the requests with more than j output tokens
        E, k = cfg.num_experts, cfg.num_experts_per_tok
        running = [sum(o > j for o in output_lens) for j in range(1, steps + 1)]
        wu = sum(weight_bytes_per_step(cfg, dtype_bytes, E * (1 - (1 - k / E) ** b)) for b in running)
        uniform = (kv + wu) / bandwidth
    return Floor(gpu, bandwidth, kv, w, steps, seconds, sum(output_lens) / seconds if seconds > 0 else 0.0, uniform)


def gpu_floor(
    input_lens: Sequence[int],
    output_lens: Sequence[int],
    cfg,
    dtype_bytes: int,
    device,
    tp: int = 1,
    kv_dtype_bytes: int | None = None,
) -> Floor | None:
    """The floor on this CUDA device, or None off CUDA or on a GPU whose bandwidth we have not measured."""
    import torch

    if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    bw = bandwidth_for(name)
    if bw is None:
        return None
    return decode_floor(input_lens, output_lens, cfg, dtype_bytes, name, bw * tp, kv_dtype_bytes)
