"""POST /v1/completions and /v1/chat/completions: one path for both, streaming (SSE) or not."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.sampling_params import SamplingParams
from engine.streams import EngineDeadError
from engine.text import Prompt
from minisgl_cli.server.engine_client import EngineClient, Job
from minisgl_cli.server.errors import APIError
from minisgl_cli.server.protocol import (
    SAMPLING_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    Reply,
    usage,
)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    return await _generate(request, body, body.single_prompt(), chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    return await _generate(request, body, body.chat_messages(), chat=True)


def _naming(param: str, e: Exception) -> str:
    return str(e) if param in str(e) else f"{param}: {e}"


def _refusal(e: Exception, chat: bool) -> APIError:
    """The engine refused the prompt (vocabulary, context length, KV capacity: 400) or its loop is gone (503)."""
    if isinstance(e, EngineDeadError):
        return APIError(503, str(e))
    param = "messages" if chat else "prompt"
    return APIError(
        400, _naming(param, e), param=param, code="context_length_exceeded" if "exceeds" in str(e) else None
    )


def _sampling_params(body: GenerationRequest, max_tokens: int, max_name: str) -> SamplingParams:
    try:
        return SamplingParams(max_tokens=max_tokens, **body.sampling_kwargs())
    except ValueError as e:  # SamplingParams names the field first: "top_p must be in (0, 1] (got 2.0)"
        name, _, rest = str(e).partition(" ")
        if name == "max_tokens":
            name = max_name
        raise APIError(400, f"{name} {rest}", param=name if name in (*SAMPLING_FIELDS, max_name) else None) from e


async def _generate(request: Request, body: GenerationRequest, prompt: Prompt, chat: bool):
    client: EngineClient = request.app.state.client
    client.check_model(body.model)
    body.check_supported()
    try:
        ids = client.encode(prompt)
    except ValueError as e:
        raise _refusal(e, chat) from e
    max_name, max_tokens = "max_tokens", body.max_tokens
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        max_name, max_tokens = "max_completion_tokens", body.max_completion_tokens
    if max_tokens is None:  # chat: whatever room the context leaves, as OpenAI does
        max_tokens = max(client.max_request_tokens - len(ids), 1) if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    params = _sampling_params(body, max_tokens, max_name)
    try:
        job = client.start(request, ids, params)
    except (ValueError, EngineDeadError) as e:
        raise _refusal(e, chat) from e
    reply = Reply(
        ("chatcmpl-" if chat else "cmpl-") + job.rid,
        client.model_name,
        chat,
        include_usage=bool(body.stream) and body.include_usage,
    )
    if body.stream:
        return StreamingResponse(
            _sse(reply, job),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        final = [out async for out in job.outputs()][-1]
    except (ValueError, EngineDeadError) as e:
        raise _refusal(e, chat) from e
    if final.finish_reason == "error":
        raise APIError(500, f"generation failed: {final.error}")
    return JSONResponse(reply.body(final.text, final.finish_reason, usage(len(ids), len(final.token_ids))))


# json.dumps(ensure_ascii=False) leaves U+0085, U+2028 and U+2029 raw, but str.splitlines() (so httpx's iter_lines and
# many SSE readers) ends a line there and cuts the event's JSON in two: escape them, JSON reads them back the same.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False).translate(_LINE_BREAKS)}\n\n"


def _text_event_parts(reply: Reply) -> tuple[str, str]:
    """The text chunk's event split around its text, so each token's event is one small json.dumps, not the
    whole chunk's (the front end's hot path; the result is the same bytes)."""
    mark = "\ue000"
    event = _event(reply.chunk(mark))
    head, tail = event.split(json.dumps(mark, ensure_ascii=False), 1)
    return head, tail


async def _sse(reply: Reply, job: Job) -> AsyncIterator[str]:
    head, tail = _text_event_parts(reply)
    try:
        if reply.chat:
            yield _event(reply.chunk("", role=True))
        async for batch in job.batches():
            events = []
            for out in batch:
                if out.finish_reason == "error":
                    events.append(_event(APIError(500, f"generation failed: {out.error}").body()))
                elif out.finished:
                    events.append(_event(reply.chunk(out.delta_text, out.finish_reason)))
                elif out.delta_text:  # tokens that complete no character yet send nothing
                    events.append(head + json.dumps(out.delta_text, ensure_ascii=False).translate(_LINE_BREAKS) + tail)
                if out.finished and reply.include_usage:
                    events.append(_event(reply.usage_chunk(usage(len(job.prompt_ids), len(out.token_ids)))))
            if events:
                yield "".join(events)
    except (ValueError, EngineDeadError) as e:
        yield _event(_refusal(e, reply.chat).body())
    yield "data: [DONE]\n\n"
