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
    noise_seed: int = field(default_factory=lambda: random.getrandbits(31))  # GPU sampling of unseeded requests
    cache_hit_tokens: int = 0  # prompt tokens served from the radix cache at first admission
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, if params.logprobs is set
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # prompt tokens 1.. (params.prompt_logprobs)
    # timing (time.perf_counter seconds)
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_device_len(self) -> int:
        """KV is never needed for the last token a request may emit."""
        return len(self.prompt_ids) + self.params.max_tokens - 1

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
        if len(self.output_ids) >= self.params.max_tokens:
            return "length"
        return None
