"""A request's life in the engine: its tokens, its KV pages, and why it finished."""

from __future__ import annotations

import enum
import random
import time
from dataclasses import dataclass, field

import torch

from engine.logprobs import TokenLogprob
from engine.sampling_params import SamplingParams
from kvcache.radix import Node

_M64 = 2**64 - 1


def seed_key(seed: int) -> int:
    """A request seed (any int in [-2^63, 2^64)) hashed to 64 bits (splitmix64's finaliser). The sampler's noise
    keeps 32 bits of it: taken from the seed itself, seeds 2^32 apart (a CPU generator's) or 2^31 - 1 apart (the
    fused kernel's old key) drew the very same tokens; hashed, two seeds collide only by chance."""
    x = (seed + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int] = frozenset()
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    # KV state. Positions [0, device_len) have K/V written (or scheduled to be, under overlap);
    # [0, cached_len) came from the radix cache and belong to the tree node `prefix_node`.
    pages: list[int] = field(default_factory=list)
    cached_len: int = 0
    device_len: int = 0
    prefix_node: Node | None = None
    slot: int = -1  # row in the runner's per-request device tables
    num_preemptions: int = 0
    rng: torch.Generator | None = None  # per-request generator when params.seed is set (CPU sampling)
    # 64 bits keying the request's noise: a hash of params.seed, else the engine's draw (from its --seed, so an
    # unseeded run repeats as a whole), else random (__post_init__)
    noise_key: int = -1
    cache_hit_tokens: int = 0  # prompt tokens served from the radix cache at first admission
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, if params.logprobs is set
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # prompt tokens 1.. (params.prompt_logprobs)
    max_tokens: int = field(init=False, default=0)  # params.max_tokens, resolved (never None here)
    # timing (time.perf_counter seconds)
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.params.max_tokens is None:
            raise ValueError("a request's max_tokens None is resolved at submission (RequestLimits.check), not here")
        self.max_tokens = self.params.max_tokens
        seed = self.params.seed
        if seed is not None:
            self.noise_key = seed_key(seed)
        elif self.noise_key == -1:
            self.noise_key = random.getrandbits(64)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_device_len(self) -> int:
        """KV is never needed for the last token a request may emit."""
        return len(self.prompt_ids) + self.max_tokens - 1

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs asked for and not all collected: its prefill must not start from the prefix cache."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_ids) - 1

    def check_token_finish(self, token: int) -> str | None:
        """Token-level stop conditions; stop strings are checked on text by the front layer."""
        if len(self.output_ids) > self.params.min_tokens:  # the sampler masks these before min_tokens anyway
            if not self.params.ignore_eos and token in self.eos_ids:
                return "stop"
            if token in self.params.stop_token_ids:
                return "stop"
        if len(self.output_ids) >= self.max_tokens:
            return "length"
        return None
