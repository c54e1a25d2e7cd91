"""Request bodies of the OpenAI completions and chat completions APIs (strict types, unknown fields ignored) and
the shapes of their responses and stream chunks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

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
)


class _Body(BaseModel):
    # strict: "5" is not an int and true is not a number; a wrong type is a 400, not a silent coercion
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool | None = False


class GenerationRequest(_Body):
    """Fields both endpoints share. None means the default."""

    # field -> the values this server accepts (OpenAI features it does not implement)
    ONLY: ClassVar[dict[str, tuple]] = {"n": (None, 1)}

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
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None

    def check_supported(self) -> None:
        for name, accepted in self.ONLY.items():
            value = getattr(self, name)
            if value not in accepted:
                only = " or ".join(repr(v) for v in accepted if v is not None)
                raise APIError(
                    400,
                    f"{name}={value!r} is not supported by this server" + (f" (only {only})" if only else ""),
                    param=name,
                    code="unsupported_parameter",
                )

    def sampling_kwargs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SAMPLING_FIELDS if getattr(self, k) is not None}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(GenerationRequest):
    ONLY = {
        **GenerationRequest.ONLY,
        "best_of": (None, 1),
        "echo": (None, False),
        "logprobs": (None,),
        "suffix": (None,),
    }

    prompt: str | list[int] | list[str] | list[list[int]]
    best_of: int | None = None
    echo: bool | None = None
    logprobs: int | None = None
    suffix: str | None = None

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise APIError(
                    400,
                    f"prompt: got {len(p)} prompts, but this server takes one prompt per request "
                    "(send them as separate requests)",
                    param="prompt",
                )
            return p[0]
        return p  # type: ignore[return-value]  # a list of ints here: a list of prompts was unwrapped above


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(p.type != "text" or p.text is None for p in self.content):
            raise APIError(400, "messages: only text content parts are supported", param="messages")
        return "".join(p.text or "" for p in self.content)  # None was rejected above


class ChatCompletionRequest(GenerationRequest):
    ONLY = {**GenerationRequest.ONLY, "logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, [])}

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None

    def chat_messages(self) -> list[dict[str, str]]:
        # newer OpenAI clients send system prompts as "developer"; chat templates know them as "system"
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True, slots=True)
class Reply:
    """Builds the response body or the stream chunks of one request, for either endpoint."""

    id: str
    model: str
    chat: bool
    include_usage: bool = False  # streaming: every chunk carries "usage": null, the last one the totals
    created: int = field(default_factory=lambda: int(time.time()))

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def body(self, text: str, finish_reason: str | None, use: dict[str, int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._envelope("chat.completion" if self.chat else "text_completion", [choice]), "usage": use}

    def chunk(self, text: str, finish_reason: str | None = None, role: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            delta: dict[str, str] = {"role": "assistant"} if role else {}
            choice["delta"] = {**delta, "content": text} if text or role else delta
        else:
            choice["text"] = text
        out = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])
        return {**out, "usage": None} if self.include_usage else out

    def usage_chunk(self, use: dict[str, int]) -> dict[str, Any]:
        return {**self._envelope("chat.completion.chunk" if self.chat else "text_completion", []), "usage": use}
