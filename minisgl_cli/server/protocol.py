"""Request bodies of the OpenAI completions and chat completions APIs (strict types; a field they do not know is a
400, as OpenAI's) and the shapes of their responses and stream chunks."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from engine.limits import RequestLimits
from engine.sampling_params import MAX_N
from engine.text import ChatPrompt
from engine.tokenizer import message_text
from minisgl_cli.server.errors import APIError

# Request fields passed straight to engine.sampling_params.SamplingParams (which validates them).
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "logit_bias",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
)


class _Body(BaseModel):
    # strict: "5" is not an int and true is not a number; a wrong type is a 400, not a silent coercion
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


def unsupported(
    name: str, value: Any, accepted: tuple[Any, ...], param: str | None = None, hint: str | None = None
) -> APIError:
    """The 400 refusing a field this server does not implement: the value given, cut short, and what to send instead
    (`hint`: why, or another way to ask for it)."""
    given = repr(value)
    given = given if len(given) <= 100 else given[:100] + "..."
    ok = " or ".join(repr(v) for v in accepted if v is not None)
    todo = "leave it out" + (f", or send {ok}" if ok else "") + (f"; {hint}" if hint else "")
    return APIError(
        400,
        f"{name}={given} is not supported by this server ({todo})",
        param=param or name,
        code="unsupported_parameter",
    )


def refuse_unknown(
    body: BaseModel, known: Collection[str], within: str | None = None, param: str | None = None
) -> None:
    """A 400 naming the fields of `body` that it does not declare and `known` does not hold (`within`: the request's
    field that `body` is; `param`: the error's, `within` by default), as OpenAI's answer ("Unrecognized request
    argument supplied: X"; vLLM ignores them with a warning): a misspelt field, or one of a newer API, that would
    change the answer is never dropped."""
    unknown = [f"{within}.{k}" if within else k for k in body.model_extra or {} if k not in known]
    if unknown:
        s = "s" if len(unknown) > 1 else ""
        why = f"Unrecognized request argument{s} supplied: {', '.join(unknown)}"
        raise APIError(400, why, param=param or within or unknown[0], code="unknown_parameter")


def refuse_unsupported(body: BaseModel, refused: dict[str, tuple[Any, ...]]) -> None:
    """A 400 naming the first field of `refused` that the body gives at a value other than those accepted."""
    extra = body.model_extra or {}
    for name, accepted in refused.items():
        value = extra.get(name, getattr(body, name, None))
        if value not in accepted:
            raise unsupported(name, value, accepted)


class StreamOptions(_Body):
    # other keys are kept for refuse_unknown, which lets OpenAI's include_obfuscation through (random padding in each
    # chunk against length side channels: the text is the same without it)
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    IGNORED: ClassVar[frozenset[str]] = frozenset({"include_obfuscation"})

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM's: every chunk also carries the usage so far

    def usage(self) -> tuple[bool, bool]:
        """(a last chunk with the usage totals, every chunk with the usage so far), as vLLM's should_include_usage:
        continuous usage needs include_usage, which vLLM's StreamOptions defaults to true, so absent beside
        continuous_usage_stats: true it is taken as true here too, and an explicit false (or null) turns both off.
        Absent otherwise it stays false (OpenAI's default; vLLM's true would add the last chunk to `{}`)."""
        asked = "include_usage" in self.model_fields_set
        last = bool(self.include_usage) if asked else bool(self.continuous_usage_stats)
        return last, last and bool(self.continuous_usage_stats)


# Fields of the OpenAI API and of vLLM's extensions that would change the answer and that this server does not
# implement: refused with a 400 naming them unless absent or at their no-op value. Fields that change nothing a
# client gets are IGNORED; any other field the request does not declare is a 400 (refuse_unknown).
_REFUSED: dict[str, tuple[Any, ...]] = {
    "response_format": (None, {"type": "text"}),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1.0),
    "prompt_logprobs": (None,),
    "truncate_prompt_tokens": (None,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "logits_processors": (None,),
    # vLLM's: token ids in the answer (RL rollouts read them), log-probabilities of named tokens, an early stop on
    # repeated n-grams, a cap on thinking tokens, a watermark; accepted and ignored they changed the answer silently
    "return_token_ids": (None, False),
    "logprob_token_ids": (None,),
    "repetition_detection": (None,),
    # the same early stop as vLLM's flat fields (0: off)
    "max_repetition_pattern_size": (None, 0),
    "min_repetition_pattern_size": (None, 0),
    "repetition_min_count": (None, 0),
    "thinking_token_budget": (None, -1),
    "watermarking": (None, False),
    # vLLM's: arguments of custom extensions (a logits processor), and the KV (or encoder cache) of a disaggregated
    # prefill to load or hand on
    "vllm_xargs": (None, {}),
    "kv_transfer_params": (None, {}),
    "ec_transfer_params": (None, {}),
}
# Fields of OpenAI's and vLLM's request bodies that change nothing a client gets here, accepted at any value:
# OpenAI's bookkeeping, storage and caching hints; vLLM's scheduling priority, session id, cache salt (this prefix
# cache is shared by all requests), chunking of a stream, the side truncate_prompt_tokens (refused) would cut, and
# fields its own generation endpoints ignore.
IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "parallel_tool_calls",  # tools are refused
        "prediction",  # a latency hint: the answer is the model's either way
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "priority",
        "session_id",
        "cache_salt",
        "stream_interval",
        "truncation_side",
        "routed_experts_prompt_start",
        "return_token_offsets",
        "return_mm_kwargs",
    }
)


class GenerationRequest(_Body):
    """Fields both endpoints share. None means the default."""

    # unknown fields are kept (not ignored) so that check_supported can see the refused ones
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    REFUSED: ClassVar[dict[str, tuple[Any, ...]]] = _REFUSED

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = None
    return_tokens_as_token_ids: bool | None = None  # vLLM's: logprobs name tokens "token_id:ID", not by their text
    include_stop_str_in_output: bool | None = None  # vLLM's: the matched stop string (or stop token's text) kept
    skip_special_tokens: bool | None = None  # vLLM's (default true): false shows special tokens' text
    spaces_between_special_tokens: bool | None = None  # vLLM's: transformers' decode switch of that name
    request_id: str | None = None  # vLLM's: the answer's id, after the X-Request-Id header's (not the engine's id)
    stream: bool | None = False
    stream_options: StreamOptions | None = None

    def check_supported(self, limits: RequestLimits) -> None:
        """What the request asks that this server cannot give (a 400 naming the field); `limits`: its engine's. A
        log-probability count of -1 (the whole vocabulary) is left resolved to its count, as top_logprobs_count reads
        it."""
        refuse_unsupported(self, self.REFUSED)
        refuse_unknown(self, self.REFUSED.keys() | IGNORED)
        so = self.stream_options
        if so is not None:
            refuse_unknown(so, so.IGNORED, "stream_options")
        if so is not None and (so.model_fields_set or so.model_extra) and not self.stream:  # vLLM's answer too
            # (vLLM refuses stream options that say something; an empty {} it lets through, as here)
            raise APIError(400, "Stream options can only be defined when stream=True", param="stream_options")
        if self.n is not None and not 1 <= self.n <= MAX_N:
            raise APIError(400, f"n must be in [1, {MAX_N}] (got {self.n})", param="n")

    def sampling_kwargs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SAMPLING_FIELDS if getattr(self, k) is not None}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.usage()[0]

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.usage()[1]

    @property
    def num_choices(self) -> int:
        return self.n or 1

    @property
    def num_samples(self) -> int:
        """Samples generated per prompt (best_of of them when more than n)."""
        return self.num_choices

    @property
    def top_logprobs_count(self) -> int | None:
        """Alternatives to report per token; None: no log-probabilities."""
        return None

    @property
    def echo_prompt(self) -> bool:
        return False


def check_logprobs(limits: RequestLimits, name: str, k: int | None) -> int | None:
    """The count of log-probabilities per token the field asks (-1: the whole vocabulary), or a 400 naming it."""
    try:
        return limits.check_logprobs(name, k)
    except ValueError as e:
        raise APIError(400, str(e), param=name) from e


class CompletionRequest(GenerationRequest):
    REFUSED = {**_REFUSED, "suffix": (None, ""), "add_special_tokens": (None, True), "prompt_embeds": (None,)}

    prompt: str | list[int] | list[str] | list[list[int]]
    # OpenAI's documented default, and vLLM's; an explicit null leaves it to the server, as chat's absent one
    max_tokens: int | None = 16
    best_of: int | None = None
    echo: bool | None = None
    logprobs: int | None = None

    def check_supported(self, limits: RequestLimits) -> None:
        super().check_supported(limits)
        self.logprobs = check_logprobs(limits, "logprobs", self.logprobs)
        if self.best_of is not None:
            if not self.num_choices <= self.best_of <= MAX_N:
                raise APIError(
                    400, f"best_of must be in [n, {MAX_N}] (got {self.best_of}, n {self.num_choices})", param="best_of"
                )
            if self.stream and self.best_of > self.num_choices:
                raise APIError(400, "best_of > n cannot be streamed (the best are known only at the end)", "best_of")

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            return list(p)
        return [p]  # type: ignore[list-item]  # a string or one list of ints (a list of prompts returned above)

    @property
    def num_samples(self) -> int:
        return max(self.best_of or 1, self.num_choices)

    @property
    def top_logprobs_count(self) -> int | None:
        return self.logprobs

    @property
    def echo_prompt(self) -> bool:
        return bool(self.echo)


class ChatMessage(_Body):
    # other keys are kept for check(): a key the server ignored was dropped even where it changed the answer
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    # Keys of an answer's message (OpenAI's, vLLM's), which the openai SDK's dump of an earlier answer sends back, and
    # DeepSeek's `prefix`: accepted at the values that add nothing to the prompt, refused by name at any other (why).
    NO_OP: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {
        # an assistant's calls of tools (left out, the turn would read as an empty message), a tool result's call id
        "tool_calls": ((None, []), "tools are not supported"),
        "function_call": ((None,), "tools are not supported"),
        "tool_call_id": ((None,), "tools are not supported"),
        "refusal": ((None, ""), "the chat template reads no refusal: send its text as the content"),
        "audio": ((None,), "audio is not supported"),
        "parsed": ((None,), "structured outputs are not supported"),
        # DeepSeek's continuation of the last assistant message; vLLM's generic chat ignores it
        "prefix": (
            (None, False),
            "to continue the last assistant message send continue_final_message: true and add_generation_prompt: false",
        ),
    }
    IGNORED: ClassVar[frozenset[str]] = frozenset({"annotations"})  # an answer's URL citations: no model reads them

    role: str
    content: str | list[dict[str, Any] | str] | None = None  # content parts: engine.tokenizer.message_text reads them
    name: str | None = None  # passed to the chat template, which renders it or not (as vLLM)
    # an assistant turn's thinking, sent back for templates that render it (Qwen3's, in a tool-calling turn): vLLM's
    # `reasoning`, and SGLang's (and vLLM's older) `reasoning_content`, reach the template under both names
    reasoning: str | None = None
    reasoning_content: str | None = None

    def check(self, i: int) -> None:
        """A 400 naming messages[i]'s first key that would change the answer and that this server does not implement,
        or that it does not know. A tool's result is refused by its role (Tokenizer.chat_prompt)."""
        if self.role in ("tool", "function"):
            return
        extra = self.model_extra or {}
        for key, (accepted, hint) in self.NO_OP.items():
            if extra.get(key) not in accepted:
                raise unsupported(f"messages[{i}].{key}", extra[key], accepted, param="messages", hint=hint)
        refuse_unknown(self, self.NO_OP.keys() | self.IGNORED, f"messages[{i}]", param="messages")

    def text(self, i: int) -> str:
        """messages[i]'s content as the template reads it, as the Python API's LLM.chat reads it."""
        try:
            return message_text(self.content, f"messages[{i}].content")
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from e


class ChatCompletionRequest(GenerationRequest):
    REFUSED = {
        **_REFUSED,
        "tools": (None, []),
        "functions": (None, []),
        "tool_choice": (None, "none", "auto"),
        "function_call": (None, "none", "auto"),
        "audio": (None,),
        "modalities": (None, ["text"]),
        "reasoning_effort": (None,),
        "web_search_options": (None,),
        "verbosity": (None,),
        "echo": (None, False),
        "add_special_tokens": (None, False),
        "chat_template": (None,),
        "documents": (None,),
        "return_prompt_text": (None, False),  # vLLM's: the templated prompt in the answer
        "best_of": (None, 1),  # completions only
        "moderation": (None,),  # OpenAI's: a moderation model scores the answer, or blocks it
        # vLLM's: false drops a reasoning parser's thinking (with none, as here, the thinking stays in the content)
        "include_reasoning": (None, True),
        "media_io_kwargs": (None, {}),  # vLLM's: for images, audio and video, which are not served
        "mm_processor_kwargs": (None, {}),
    }

    messages: list[ChatMessage]
    chat_template_kwargs: dict[str, Any] | None = None  # the template's variables (Qwen3's enable_thinking)
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False  # the answer continues the last message (a prefilled assistant turn)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def check_supported(self, limits: RequestLimits) -> None:
        super().check_supported(limits)
        if self.top_logprobs is not None:
            # the engine's max_logprobs alone, as vLLM's: not OpenAI's 20, where the server allows more
            self.top_logprobs = check_logprobs(limits, "top_logprobs", self.top_logprobs)
            if not self.logprobs:
                raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")

    @property
    def top_logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat_prompt(self) -> ChatPrompt:
        return chat_prompt(self, self.messages)


def chat_prompt(body: ChatCompletionRequest | TokenizeRequest, messages: list[ChatMessage]) -> ChatPrompt:
    """The messages with the body's template switches and variables (chat completions and /tokenize take the same)."""
    return ChatPrompt(
        conversation(messages),
        body.chat_template_kwargs or {},
        body.add_generation_prompt is not False,
        bool(body.continue_final_message),
    )


def conversation(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """The messages as the chat template takes them (a 400 naming what it cannot hold)."""
    out = []
    for i, m in enumerate(messages):
        m.check(i)
        # newer OpenAI clients send system prompts as "developer"; chat templates know them as "system"
        message = {"role": "system" if m.role == "developer" else m.role, "content": m.text(i)}
        if m.name is not None:
            message["name"] = m.name
        reasoning = _reasoning(m, i)
        if reasoning is not None:
            message["reasoning"] = message["reasoning_content"] = reasoning
        out.append(message)
    return out


def _reasoning(m: ChatMessage, i: int) -> str | None:
    """messages[i]'s thinking for the template: an assistant's, under either name (given both, they must agree)."""
    given = {k: v for k, v in (("reasoning", m.reasoning), ("reasoning_content", m.reasoning_content)) if v is not None}
    if not given:
        return None
    name = next(iter(given))
    if m.role != "assistant":
        raise APIError(400, f"messages[{i}].{name}: only an assistant message carries reasoning", param="messages")
    if len(set(given.values())) > 1:
        why = f"messages[{i}]: reasoning and reasoning_content differ (send one of them)"
        raise APIError(400, why, param="messages")
    return given[name]


class TokenizeRequest(_Body):
    """A completion's `prompt` or a chat's `messages` (one of the two), tokenized as the matching endpoint would."""

    # what vLLM's tokenize takes that would give other ids than the generation endpoints count: refused by name
    PROMPT_REFUSED: ClassVar[dict[str, tuple[Any, ...]]] = {
        "add_special_tokens": (None, True),
        # a chat's switches: a text prompt has no template to take them
        "chat_template_kwargs": (None, {}),
        "add_generation_prompt": (None, True),
        "continue_final_message": (None, False),
    }
    CHAT_REFUSED: ClassVar[dict[str, tuple[Any, ...]]] = {
        "add_special_tokens": (None, False),
        "chat_template": (None,),
        "tools": (None, []),
        "mm_processor_kwargs": (None, {}),
    }

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)  # the refused fields are extras

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    return_token_strs: bool | None = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object; `cached_tokens`, the prompt tokens read from the prefix cache, goes in its
    prompt_tokens_details (the chat's --url panel and other clients read cache hits there)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


@dataclass(frozen=True, slots=True)
class Reply:
    """Builds the response body or the stream chunks of one request, for either endpoint."""

    id: str
    model: str
    chat: bool
    include_usage: bool = False  # streaming: every chunk carries "usage": null, the last one the totals
    continuous_usage: bool = False  # with include_usage: every chunk's "usage" is its choice's usage so far
    created: int = field(default_factory=lambda: int(time.time()))

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        logprobs: dict[str, Any] | None = None,
        stop_reason: str | int | None = None,
    ) -> dict[str, Any]:
        """One choice of a whole (non-streamed) answer. stop_reason: vLLM's, the stop string or stop token id that
        ended it (None for EOS, the length, or while it runs)."""
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason}
        choice["stop_reason"] = stop_reason
        if self.chat:
            # vLLM's message always holds its reasoning field (null without a --reasoning-parser, the thinking left in
            # the content, as here), and its examples read it: `reasoning`, `reasoning_content` before the rename
            choice["message"] = {"role": "assistant", "content": text, "reasoning": None, "reasoning_content": None}
        else:
            choice["text"] = text
        return choice

    def body(self, choices: list[dict[str, Any]], use: dict[str, int]) -> dict[str, Any]:
        return {**self._envelope("chat.completion" if self.chat else "text_completion", choices), "usage": use}

    def chunk(
        self,
        text: str,
        finish_reason: str | None = None,
        role: bool = False,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        so_far: tuple[int, int] = (0, 0),
        stop_reason: str | int | None = None,
    ) -> dict[str, Any]:
        """One choice's chunk; `so_far` is its (prompt tokens, completion tokens) up to and including this chunk,
        its "usage" with continuous usage (as vLLM: per choice, and per prompt of a list; the last chunk sums all)."""
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason}
        choice["stop_reason"] = stop_reason
        if self.chat:
            delta: dict[str, str] = {"role": "assistant"} if role else {}
            choice["delta"] = {**delta, "content": text} if text or role else delta
        else:
            choice["text"] = text
        out = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])
        if not self.include_usage:
            return out
        return {**out, "usage": usage(*so_far) if self.continuous_usage else None}

    def usage_chunk(self, use: dict[str, Any]) -> dict[str, Any]:
        return {**self._envelope("chat.completion.chunk" if self.chat else "text_completion", []), "usage": use}
