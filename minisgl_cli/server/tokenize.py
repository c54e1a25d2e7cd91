"""vLLM's POST /tokenize and /detokenize and GET /version: a prompt's token ids as the generation endpoints count them
(a completion's text, or a chat's messages through the model's chat template), ids back to text, and the server's
version. Clients that build prompts of an exact token count, or check a context budget, call these."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from minisgl_cli.server.completions import refusal
from minisgl_cli.server.engine_client import EngineClient
from minisgl_cli.server.errors import APIError
from minisgl_cli.server.protocol import DetokenizeRequest, TokenizeRequest, chat_prompt, refuse_unsupported

router = APIRouter()


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    client: EngineClient = request.app.state.client
    client.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give a prompt (text) or messages (a chat), one of the two", param="prompt")
    chat = body.messages is not None
    refuse_unsupported(body, TokenizeRequest.CHAT_REFUSED if chat else TokenizeRequest.PROMPT_REFUSED)
    if body.messages == []:
        raise APIError(400, "messages must not be empty", param="messages")
    prompt = chat_prompt(body, body.messages) if body.messages is not None else body.prompt or ""
    try:
        ids = await asyncio.to_thread(client.encode, prompt) if prompt or chat else []  # vLLM: "" is no tokens
    except ValueError as e:
        raise refusal(e, "messages" if chat else "prompt") from e
    # what one request can hold, as /v1/models says: the context, or the KV cache where that is smaller
    out: dict[str, Any] = {"count": len(ids), "max_model_len": client.max_request_tokens, "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = client.remote.tokenizer.pieces(ids)
    return out


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, str]:
    client: EngineClient = request.app.state.client
    client.check_model(body.model)
    vocab = client.limits.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"tokens: id {bad} is outside the vocabulary (0-{vocab - 1})", param="tokens")
    text = await asyncio.to_thread(client.remote.tokenizer.decode, body.tokens, False)
    return {"prompt": text}


@router.get("/version")
async def version() -> dict[str, str]:
    from minisgl_cli import version as minisgl_version

    return {"version": minisgl_version()}
