"""Per-request sampling settings, validated at construction and at submission so bad values never reach the engine."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TypeGuard

MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]
MAX_N = 128  # most choices of one prompt (OpenAI's limit on n and best_of)


class RequestOutputKind(IntEnum):
    """vLLM's: what each output of a request streamed by AsyncLLM.generate() holds."""

    CUMULATIVE = 0  # the text, tokens and logprobs so far
    DELTA = 1  # only what is new since the request's last output
    FINAL_ONLY = 2  # one output: the finished one


@dataclass(slots=True)
class SamplingParams:
    # vLLM's default, 16: a script ported from it gets the same outputs. None: as many as the context leaves after the
    # prompt (vLLM's None), resolved at submission (RequestLimits.check)
    max_tokens: int | None = 16
    temperature: float = 1.0  # 0 means greedy
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    min_tokens: int = 0  # EOS and stop_token_ids are masked (stop strings not matched) before this many tokens
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit before sampling
    # Log-probabilities of the raw model distribution (before penalties, bias, temperature, top-k/p: vLLM's default
    # `raw_logprobs`): None = none; k = the chosen token's and the k most likely alternatives'.
    logprobs: int | None = None  # per output token
    prompt_logprobs: int | None = None  # per prompt token after the first (the prompt is then not read from cache)
    # False: token ids only, no text (vLLM's `detokenize=False`; bench-offline, whose peers skip it too). Stop
    # strings are matched in the text, so they need it.
    detokenize: bool = True
    # vLLM's: the stop string, or the text of the stop_token_ids token, that ended the request stays in the text
    include_stop_str_in_output: bool = False
    # vLLM's and SGLang's (default True both): special tokens (EOS, <|im_end|>, ...) left out of the text; False shows
    # their text where the output holds them (not the one that ended the request: that is include_stop_str_in_output)
    skip_special_tokens: bool = True
    # transformers' decode switch, as vLLM and SGLang pass it: a Python ("slow") tokenizer joins added tokens to the
    # text around them with spaces; a fast one (tokenizer.json, GGUF) never does, so there it changes nothing
    spaces_between_special_tokens: bool = True
    # Choices of the prompt (vLLM's n): LLM.generate and LLM.chat run one request per choice, choice j with seed + j
    # (vLLM's rule), and return them together as one output's `outputs`. A request submitted alone (add_request,
    # stream, the engine itself) is one choice: n = 1 only.
    n: int = 1
    # vLLM's: read by AsyncLLM.generate() alone. LLM.generate() returns each request's finished output whatever it says
    # (vLLM's LLM sets FINAL_ONLY), and LLM.stream() gives both the text so far and its delta in every output.
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if self.seed == -1 and _integer(self.seed):
            self.seed = None  # as vLLM (and its OpenAI server): -1 asks for no seed, a fresh draw each time
        # vLLM declares these Optional: None (what ported code passes through from its own options) is none
        if self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if self.logit_bias is None:
            self.logit_bias = {}
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.stop, tuple):
            self.stop = list(self.stop)
        if isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids)
        if isinstance(self.logit_bias, dict):  # JSON object keys are strings
            self.logit_bias = {_token_id(k): v for k, v in self.logit_bias.items()}
        self.validate()

    def clone(self) -> SamplingParams:
        """vLLM's clone, a deep copy: its stop, stop_token_ids and logit_bias are copies too (what they hold is
        immutable). Each submitted request runs with one (RequestLimits.check), so the caller's later edits of its
        object reach no request already submitted. Not validated: submission validates the copy."""
        c = copy.copy(self)  # ~5 us with the containers; dataclasses.replace runs __post_init__'s validation too
        c.stop, c.stop_token_ids = copy.copy(self.stop), copy.copy(self.stop_token_ids)
        c.logit_bias = copy.copy(self.logit_bias)
        return c

    def choice(self, j: int) -> SamplingParams:
        """Choice j of a prompt's n, as a request of its own: a clone with n = 1 and, if seeded, seed + j (vLLM's
        rule: the choices differ, and each is reproducible as one request with that seed; a -1 so reached is a seed,
        not "no seed"). Not validated: seed + j may be past the range, which submission refuses."""
        c = self.clone()
        c.n = 1
        if c.seed is not None:
            c.seed += j
        return c

    def validate(self) -> None:
        """ValueError naming the first bad field. Run at construction and again at submission, on the request's own copy
        (RequestLimits.check): the fields can be assigned afterwards, and a temperature set to -1 or max_tokens to 0
        was sampled with."""
        # Types first: a string compared below raised a bare TypeError, and ignore_eos="false" was truthy (EOS ignored)
        numbers = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
        for name in numbers:
            if not _finite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number (got {_short(getattr(self, name))})")
            # as floats: an int past 2**63 (temperature=2**64) went into the sampler's int64 tensor and failed the step,
            # which ends the engine for every request
            setattr(self, name, float(getattr(self, name)))
        for name in ("max_tokens", "top_k", "min_tokens", "n"):
            if not _integer(getattr(self, name)) and not (name == "max_tokens" and self.max_tokens is None):
                raise ValueError(f"{name} must be an integer (got {getattr(self, name)!r})")
        switches = (
            "ignore_eos",
            "detokenize",
            "include_stop_str_in_output",
            "skip_special_tokens",
            "spaces_between_special_tokens",
        )
        for name in switches:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false (got {getattr(self, name)!r})")
        if _integer(self.output_kind) and 0 <= self.output_kind < len(RequestOutputKind):  # an int off the wire
            self.output_kind = RequestOutputKind(self.output_kind)
        if not isinstance(self.output_kind, RequestOutputKind):
            why = "must be a RequestOutputKind: CUMULATIVE, DELTA or FINAL_ONLY"
            raise ValueError(f"output_kind {why} (got {self.output_kind!r})")
        if not isinstance(self.stop, list) or not isinstance(self.stop_token_ids, list):
            raise ValueError(f"stop and stop_token_ids must be lists (got {self.stop!r}, {self.stop_token_ids!r})")
        checks = [
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be an integer >= 1"),
            (1 <= self.n <= MAX_N, "n", f"must be an integer in [1, {MAX_N}]"),
            (self.temperature >= 0, "temperature", "must be >= 0"),
            (-1 <= self.top_k < 2**63, "top_k", "must be -1 (off) or a positive 64-bit integer"),
            (0 < self.top_p <= 1, "top_p", "must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p", "must be in [0, 1]"),
            # far below 1e-6, dividing fp32 logits by it overflows to inf and every draw turns into NaN noise
            (self.repetition_penalty >= 1e-6, "repetition_penalty", "must be >= 1e-6"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty", "must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty", "must be in [-2, 2]"),
            (
                self.seed is None or (_integer(self.seed) and -(2**63) <= self.seed < 2**64),
                "seed",
                "must be a 64-bit integer",
            ),  # torch.Generator.manual_seed range; beyond it the sampler would raise
            (all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings"),
            (
                all(not isinstance(s, str) or _unicode(s) for s in self.stop),
                "stop",
                "must be valid Unicode (a lone UTF-16 surrogate never appears in the text)",
            ),
            (
                all(_integer(t) and t >= 0 for t in self.stop_token_ids),
                "stop_token_ids",
                "must be non-negative integers",
            ),
            (
                0 <= self.min_tokens <= max(self.max_tokens if self.max_tokens is not None else self.min_tokens, 0),
                "min_tokens",
                "must be an integer in [0, max_tokens]",
            ),
            (
                isinstance(self.logit_bias, dict)
                and all(
                    _integer(k) and k >= 0 and _finite(v) and abs(v) <= MAX_LOGIT_BIAS  # a bool key failed the step
                    for k, v in self.logit_bias.items()
                ),
                "logit_bias",
                f"must map token ids to numbers in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
            ),
            # the most per token is the engine's (max_logprobs: RequestLimits.check)
            (_logprob_count(self.logprobs), "logprobs", "must be an integer >= 0, or -1 for the whole vocabulary"),
            (
                _logprob_count(self.prompt_logprobs),
                "prompt_logprobs",
                "must be an integer >= 0, or -1 for the whole vocabulary",
            ),
            (self.detokenize or not self.stop, "stop", "strings need detokenize=True: they are matched in the text"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"{name} {why} (got {getattr(self, name)!r})")

    @property
    def greedy(self) -> bool:
        # Below 1e-5 a temperature is greedy in effect; far below, dividing fp32 logits by it overflowed to
        # inf/NaN and sampled token 0 every time.
        return self.temperature < 1e-5 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def has_filters(self) -> bool:
        """top-k / top-p / min-p: the torch sampler's rows (the fused GPU kernel samples the whole distribution)."""
        return self.top_k > 1 or self.top_p < 1 or self.min_p > 0


def _token_id(key: int | str) -> int:
    """A logit_bias key as an int ("42" -> 42); anything else is left as it is, for the check to refuse (" 5" and
    Arabic-Indic digits, which int() reads, too: a token id is written in ASCII digits)."""
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    return key  # type: ignore[return-value]  # not an id: __post_init__'s check names logit_bias


def _unicode(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _real(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v: object) -> bool:
    try:
        return _real(v) and math.isfinite(v)
    except OverflowError:  # an int beyond any float
        return False


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _logprob_count(k: object) -> bool:
    """None, a count, or vLLM's -1: the whole vocabulary (RequestLimits.check resolves it against the engine's)."""
    return k is None or (_integer(k) and k >= -1)
