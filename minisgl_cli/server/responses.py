"""POST /v1/responses: OpenAI's Responses API (newer OpenAI SDK code and agents call it), as vLLM serves it, for text:
`input` (a string or messages) and `instructions` through the chat template, one assistant message out, streamed
as the API's typed events or whole. Tools, stored conversations (`previous_response_id`) and structured output are
refused by name: each would change the answer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from engine.streams import EngineDeadError
from engine.text import ChatPrompt, RequestOutput
from engine.tokenizer import message_text
from minisgl_cli.server.completions import final_output, refusal, sampling_params
from minisgl_cli.server.engine_client import EngineClient, Job, JobSpec
from minisgl_cli.server.errors import APIError
from minisgl_cli.server.protocol import IGNORED, refuse_unknown, refuse_unsupported, unsupported

router = APIRouter()


# Items and parts take every key the openai SDK's own model_dump() of an earlier output writes (`input +=
# [o.model_dump() for o in response.output]`, history stored as JSON), and refuse any other by name, as chat
# completions' messages do: a misspelt or newer key that would change the answer is never dropped.
class InputPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # the extras are refused by InputMessage.check
    IGNORED: ClassVar[frozenset[str]] = frozenset({"prompt_cache_breakpoint"})  # a caching hint: the text is the same

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an earlier answer's output_text sent back carries them (always [] here)
    logprobs: list[Any] | None = None  # and these (always [] here): refused, `input += response.output` was a 400


class InputMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # the extras are refused by check()
    # OpenAI's label of an assistant message as commentary or final answer, which its models read: null in the SDK's
    # dump of this server's answers, refused at any other value (no chat template here reads it)
    NO_OP: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {"phase": ((None,), "no chat template here reads it")}

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]
    id: str | None = None  # an earlier output item sent back as input
    status: str | None = None

    def check(self, i: int) -> None:
        """A 400 naming input[i]'s first key, or its parts', that this server does not know or implement."""
        extra = self.model_extra or {}
        for key, (accepted, hint) in self.NO_OP.items():
            if extra.get(key) not in accepted:
                raise unsupported(f"input[{i}].{key}", extra[key], accepted, param="input", hint=hint)
        refuse_unknown(self, self.NO_OP.keys(), f"input[{i}]", param="input")
        for j, part in enumerate(self.content if isinstance(self.content, list) else []):
            refuse_unknown(part, part.IGNORED, f"input[{i}].content[{j}]", param="input")

    def text(self) -> str:
        """The content's parts a line each, as chat's (engine.tokenizer.message_text: vLLM joins both alike)."""
        parts = self.content if isinstance(self.content, str) else [p.model_dump() for p in self.content]
        return message_text(parts, "input")


def _where(e: ValidationError) -> str:
    """The deepest of pydantic's errors as `.content[0].text: <why> (got <value>)`, without the union members' names
    pydantic puts in the path (`str`, `list[InputPart]`)."""
    err = max(e.errors(), key=lambda d: len(d["loc"]))
    path = [k for k in err["loc"] if not (isinstance(k, str) and (k == "str" or "[" in k))]
    where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path)
    return f"{where}: {err['msg']} (got {err['input']!r:.60})"


class ResponsesRequest(BaseModel):
    # unknown fields are kept so that check_supported can see the refused ones
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    REFUSED: ClassVar[dict[str, tuple[Any, ...]]] = {
        "tools": (None, []),
        "tool_choice": (None, "none", "auto"),
        "previous_response_id": (None,),  # no stored responses here
        "conversation": (None,),
        "prompt": (None,),  # stored prompt templates
        "reasoning": (None,),  # effort / summary: the model's template decides
        "background": (None, False),
        "include": (None, []),
        "top_logprobs": (None, 0),
        "truncation": (None, "disabled"),
        "text": (None, {"format": {"type": "text"}}),  # JSON output (structured) is not served
        # vLLM's extension that chat completions refuse too
        "structured_outputs": (None,),
        "moderation": (None,),  # a moderation model scores the answer, or blocks it
        "context_management": (None, []),  # compaction of the context as it fills
        "access_programs": (None,),
        "image": (None,),
    }
    # accepted at any value (beside protocol.IGNORED, the chat endpoints' list): options of refused features
    # (background, built-in tools) and the stream's obfuscation padding (its only option)
    IGNORED: ClassVar[frozenset[str]] = frozenset({"background_options", "max_tool_calls", "stream_options"})
    # vLLM's sampling extensions of this endpoint, passed to SamplingParams as chat completions pass them
    SAMPLING: ClassVar[tuple[str, ...]] = (
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "ignore_eos",
        "logit_bias",
        "skip_special_tokens",
        "include_stop_str_in_output",
    )

    model: str | None = None
    input: str | list[InputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool | None = None
    logit_bias: dict[str, float] | None = None
    skip_special_tokens: bool | None = None  # vLLM's (default true): false shows special tokens' text
    include_stop_str_in_output: bool | None = None  # vLLM's: the stop string that matched stays in the text
    stream: bool | None = False
    store: bool | None = None  # nothing is stored; nothing reads it back either (previous_response_id is refused)
    metadata: dict[str, str] | None = None
    user: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's, as chat completions take them
    request_id: str | None = None  # vLLM's: the response's id as given (its default: resp_<random>)

    @field_validator("input", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        """Items and parts this server cannot read, named (pydantic said "expected str or list[InputMessage]"). An
        APIError, not a ValueError: it passes pydantic's union errors by and reaches the client as it is."""
        for i, item in enumerate(value if isinstance(value, list) else []):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind not in (None, "message"):
                what = "tool calls and their outputs (tools)" if "call" in str(kind) else "items other than messages"
                why = f"input[{i}] is a {kind!r} item: {what} are not supported by this server (send messages)"
                raise APIError(400, why, "input", "unsupported_parameter")
            parts = item.get("content") if isinstance(item, dict) else None
            for j, part in enumerate(parts if isinstance(parts, list) else []):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in (None, "input_text", "output_text"):
                    why = f"input[{i}].content[{j}] is an {kind!r} part: images, files and audio are not supported"
                    raise APIError(
                        400, why + " by this server (send input_text parts)", "input", "unsupported_parameter"
                    )
            if isinstance(item, dict):  # the field at fault, named (pydantic's union error named none)
                try:
                    message = InputMessage.model_validate(item)
                except ValidationError as e:
                    raise APIError(400, f"input[{i}]{_where(e)}", "input") from None
                message.check(i)
        return value

    def chat(self) -> ChatPrompt:
        messages = [] if self.instructions is None else [{"role": "system", "content": self.instructions}]
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            for m in self.input:
                # newer clients send system prompts as "developer"; chat templates know them as "system"
                messages.append({"role": "system" if m.role == "developer" else m.role, "content": m.text()})
        if not messages:
            raise APIError(400, "input must not be empty", param="input")
        # vLLM's should_continue_final_message: an assistant message left in progress or incomplete (an output item
        # of a response cut short, sent back) is continued; any other last message is answered in a new turn
        last = self.input[-1] if isinstance(self.input, list) and self.input else None
        partial = last is not None and last.role == "assistant" and last.status in ("in_progress", "incomplete")
        return ChatPrompt(messages, self.chat_template_kwargs or {}, not partial, partial)


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request):
    client: EngineClient = request.app.state.client
    client.check_model(body.model)
    refuse_unsupported(body, body.REFUSED)
    refuse_unknown(body, body.REFUSED.keys() | body.IGNORED | IGNORED)
    try:
        ids = await asyncio.to_thread(client.encode, body.chat())  # off the event loop: a long input takes a while
    except ValueError as e:
        raise refusal(e, "input") from e
    given = {k: getattr(body, k) for k in body.SAMPLING if getattr(body, k) is not None}
    room = client.limits.room(len(ids))
    params = sampling_params(given, body.max_output_tokens, "max_output_tokens", client.sampling_defaults, room)
    try:
        (job,) = client.start(request, [JobSpec(ids, params)])
    except (ValueError, EngineDeadError) as e:  # the context or the KV cache cannot hold it, a bias id, ...
        raise refusal(e, "input") from e
    reply = _Reply(job, body, client.model_name, len(ids))
    if body.stream:
        return StreamingResponse(
            reply.events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        final = await final_output(job, "input")
    finally:
        if not job.finished:
            job.abort()
    return JSONResponse(reply.response(final))


class _Reply:
    """The response object and its stream of events for one job."""

    def __init__(self, job: Job, body: ResponsesRequest, model: str, prompt_tokens: int) -> None:
        self.job, self.body, self.model, self.prompt_tokens = job, body, model, prompt_tokens
        self.id, self.item_id = body.request_id or f"resp_{job.rid}", f"msg_{job.rid}"
        self.created = int(time.time())
        self.seq = 0

    def response(self, final: RequestOutput | None) -> dict[str, Any]:
        """The whole response: in progress (final None: no output yet), or done."""
        status, incomplete, output, usage = "in_progress", None, [], None
        if final is not None:
            done = final.finish_reason == "stop"
            status = "completed" if done else "incomplete"
            if not done:
                incomplete = {"reason": "max_output_tokens" if final.finish_reason == "length" else "cancelled"}
            output = [self.message(final.text, "completed" if done else "incomplete")]
            cached = min(self.job.cache_hit_tokens, self.prompt_tokens)
            out_tokens = len(final.token_ids)
            usage = {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": out_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + out_tokens,
            }
        b = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "temperature": self.job.params.temperature,
            "top_p": self.job.params.top_p,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "truncation": "disabled",
            "usage": usage,
            "user": b.user,
            "metadata": b.metadata or {},
        }

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [] if status == "in_progress" else [self.part(text)]
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant", "content": content}

    @staticmethod
    def part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def event(self, kind: str, **fields: Any) -> str:
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        # the event's name on its own line too, as OpenAI sends it; U+2028/U+2029 escaped so no reader splits a line
        data = json.dumps(obj, ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
        return f"event: {kind}\ndata: {data}\n\n"

    async def events(self) -> AsyncIterator[str]:
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        final: RequestOutput | None = None
        try:
            yield self.event("response.created", response=self.response(None))
            yield self.event("response.in_progress", response=self.response(None))
            yield self.event("response.output_item.added", output_index=0, item=self.message("", "in_progress"))
            yield self.event("response.content_part.added", **where, part=self.part(""))
            async for batch in self.job.batches():
                delta = "".join(out.delta_text for out in batch)
                final = batch[-1]
                if delta:
                    yield self.event("response.output_text.delta", **where, delta=delta, logprobs=[])
        except (ValueError, EngineDeadError) as e:  # the engine refused it or went away mid-answer
            failed = {**self.response(None), "status": "failed", "error": {"code": "server_error", "message": str(e)}}
            yield self.event("response.failed", response=failed)
            return
        finally:
            if not self.job.finished:
                self.job.abort()
        assert final is not None
        if final.finish_reason == "error":
            failed = {
                **self.response(None),
                "status": "failed",
                "error": {"code": "server_error", "message": str(final.error)},
            }
            yield self.event("response.failed", response=failed)
            return
        done = self.response(final)
        item = done["output"][0]
        yield self.event("response.output_text.done", **where, text=final.text, logprobs=[])
        yield self.event("response.content_part.done", **where, part=self.part(final.text))
        yield self.event("response.output_item.done", output_index=0, item=item)
        yield self.event(
            "response.completed" if done["status"] == "completed" else "response.incomplete", response=done
        )
