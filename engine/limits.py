"""What a request may ask of an engine (its vocabulary, context length, KV capacity, log-probability counts), checked
by the engine and, before sending, by a remote front end. Nothing here touches torch."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import MAX_LOGPROBS
from engine.sampling_params import SamplingParams


class ContextOverflow(ValueError):
    """A request's prompt plus max_tokens is over the model's context length or the KV pool's capacity (`limit`)."""

    def __init__(self, message: str, prompt_tokens: int, max_tokens: int, limit: int) -> None:
        super().__init__(message)
        self.prompt_tokens, self.max_tokens, self.limit = prompt_tokens, max_tokens, limit


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What a request may ask of this engine; checked by the engine and, before sending, by a remote front end."""

    vocab_size: int
    max_model_len: int
    kv_capacity: int  # tokens the whole KV pool holds
    max_logprobs: int = MAX_LOGPROBS  # EngineConfig.max_logprobs within the vocabulary (its -1: the vocabulary size)

    @property
    def max_request_tokens(self) -> int:
        """The most tokens (prompt + output) one request may span."""
        return min(self.max_model_len, self.kv_capacity)

    def room(self, prompt_tokens: int) -> int:
        """The output tokens a prompt of this length leaves room for: a max_tokens the request did not give stays
        within it. At least 1, so that a prompt too long by itself is refused for its own length."""
        return max(self.max_request_tokens - prompt_tokens, 1)

    def check_prompt(self, prompt_ids: list[int]) -> None:
        """ValueError for an empty prompt or an id outside the vocabulary (before anything decodes the ids: the
        tokenizer raises OverflowError on a negative or huge one)."""
        if not prompt_ids:
            raise ValueError("prompt is empty")
        fast = set(map(type, prompt_ids)) <= {int} and min(prompt_ids) >= 0 and max(prompt_ids) < self.vocab_size
        bad = [] if fast else [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]!r} is outside the vocabulary [0, {self.vocab_size})")

    def check(self, prompt_ids: list[int], params: SamplingParams) -> SamplingParams:
        """The request's own copy of `params`, checked (ValueError if this engine cannot run it). Every submission
        (LLM, AsyncLLM, RemoteLLM) runs the request with that copy: with the caller's object, a field it edited after
        submitting (a temperature set to -1, max_tokens shortened, a stop token appended) reached the running request
        unchecked."""
        if not isinstance(params, SamplingParams):  # e.g. a string in a list of params: an AttributeError before
            raise ValueError(f"sampling params must be a SamplingParams (got {type(params).__name__} {params!r:.40})")
        params = params.clone()
        params.validate()  # again: a field assigned after construction was never checked
        if params.n != 1:
            raise ValueError(
                f"n={params.n}: a request is one choice; LLM.generate() and chat() run n choices (one request each)"
            )
        self.check_prompt(prompt_ids)
        params.logprobs = self.check_logprobs("logprobs", params.logprobs)
        params.prompt_logprobs = self.check_logprobs("prompt_logprobs", params.prompt_logprobs)
        for name, ids in (("logit_bias", params.logit_bias), ("stop_token_ids", params.stop_token_ids)):
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise ValueError(f"{name}: token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if params.max_tokens is None:  # vLLM's None: what the context (and the KV cache) leaves after the prompt
            params.max_tokens = self.room(len(prompt_ids))
            if params.min_tokens > params.max_tokens:
                raise ValueError(
                    f"min_tokens ({params.min_tokens}) is more than the {params.max_tokens} tokens the context leaves "
                    f"after the prompt ({len(prompt_ids)} tokens)"
                )
        total = len(prompt_ids) + params.max_tokens
        asked = f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total}"
        if total > self.max_model_len:
            over = f"{asked} exceeds the model's context length {self.max_model_len}"
            if total > self.kv_capacity and self.kv_capacity < self.max_model_len:
                # name the limit that binds too: /v1/models reports it, and the next try would meet it
                over += f" and the KV cache capacity of {self.kv_capacity} tokens"
            limit = min(self.max_model_len, self.kv_capacity)
            raise ContextOverflow(over, len(prompt_ids), params.max_tokens, limit)
        if total > self.kv_capacity:
            over = f"{asked} exceeds the KV cache capacity of {self.kv_capacity} tokens"
            raise ContextOverflow(over, len(prompt_ids), params.max_tokens, self.kv_capacity)
        return params

    def check_logprobs(self, name: str, k: int | None) -> int | None:
        """vLLM's max_logprobs: the log-probabilities a request asks per token (`name` its field) are at most this
        engine's setting. Returns the count, a request's -1 (vLLM's: the whole vocabulary) as the vocabulary size."""
        count = self.vocab_size if k == -1 else k
        if count is not None and not 0 <= count <= self.max_logprobs:
            raise ValueError(
                f"{name} must be in [0, {self.max_logprobs}] or -1 for the whole vocabulary where the engine's "
                f"max_logprobs allows it (got {k}): LLM(max_logprobs=N), serve --max-logprobs N (-1: the vocabulary)"
            )
        return count

    def check_choices(self, prompt_len: int, max_tokens: int | None, n: int, name: str = "n") -> None:
        """n samples of one prompt share its KV pages: all of them must fit in the cache at once. max_tokens None:
        the request set no max_tokens (its default, the model's max_new_tokens or the rest of the context, is a ceiling,
        not a reservation; the scheduler preempts when the cache fills), so each choice needs room for one token at
        least."""
        need = prompt_len + n * (max_tokens or 1)
        if n > 1 and need > self.kv_capacity:
            each = "at least 1 token each" if max_tokens is None else f"{n} x max_tokens ({max_tokens})"
            raise ValueError(
                f"{name}={n} choices need prompt ({prompt_len} tokens) + {each} = {need} "
                f"tokens of KV cache at once, over its capacity of {self.kv_capacity}"
            )
