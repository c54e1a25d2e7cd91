"""The FastAPI app: OpenAI-compatible completions and chat, /v1/models, /health and /metrics over one engine
(a RemoteLLM: the engine runs in its own process)."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from engine.remote_llm import RemoteLLM
from minisgl_cli.server.completions import router
from minisgl_cli.server.engine_client import EngineClient
from minisgl_cli.server.errors import APIError, install_error_handlers
from minisgl_cli.server.generate import router as generate_router
from minisgl_cli.server.responses import router as responses_router
from minisgl_cli.server.tokenize import router as tokenize_router

GUARDED_PATHS = ("/reset_prefix_cache", "/flush_cache", "/generate")  # beside /v1: what runs or changes state


def create_app(
    remote: RemoteLLM,
    model_name: str | None = None,
    max_queued_requests: int | None = None,
    allowed_origins: tuple[str, ...] = (),
    api_key: str | None = None,
    sampling_defaults: dict[str, Any] | None = None,
) -> FastAPI:
    """model_name: what clients pass as `model` (default: the engine's model name).
    max_queued_requests: beyond --max-running-requests + this many requests in flight, answer 429.
    allowed_origins: web pages (origins, or "*" for any) whose scripts may call the API: CORS headers and preflight
    answers for them (vLLM's --allowed-origins); none by default, so a page elsewhere cannot drive a local server.
    api_key: every /v1 request, and the cache's reset, must carry `Authorization: Bearer <api_key>` (vLLM's
    --api-key); /health and /metrics stay open, as vLLM's do.
    sampling_defaults: what a request that leaves a sampling field out gets (the model's generation_config.json)."""
    assert remote.info is not None, "start() the RemoteLLM first"
    name = model_name or remote.info.model
    client = EngineClient(remote, name, max_queued_requests, sampling_defaults)
    created = int(time.time())
    app = FastAPI(title="minisgl", summary="OpenAI-compatible server over the minisgl engine")
    app.state.client = client
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(tokenize_router)
    app.include_router(responses_router)
    app.include_router(generate_router)
    if api_key is not None:
        want = f"Bearer {api_key}".encode()

        @app.middleware("http")
        async def check_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            # a browser's preflight (OPTIONS) carries no credentials: the CORS layer, added after, answers it first
            guarded = request.url.path.startswith("/v1") or request.url.path in GUARDED_PATHS
            if guarded and request.method != "OPTIONS":
                got = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(got, want):
                    why = "missing" if not got else "wrong"
                    message = f"{why} API key: this server needs the header 'Authorization: Bearer <its --api-key>'"
                    return APIError(401, message, code="invalid_api_key", type="authentication_error").response()
            return await call_next(request)

    if allowed_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"], allow_headers=["*"]
        )

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> JSONResponse:
        if remote.alive:
            return JSONResponse({"status": "ok"})
        raise APIError(503, f"engine is not running: {remote.error or 'stopped'}")

    card = {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "minisgl",
        # what one request can hold: the context, or the KV pool where that is smaller (--num-pages 40: 640 tokens,
        # and a client sizing its prompts by the context got 400s)
        "max_model_len": client.max_request_tokens,
    }

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/v1/models/{model:path}")  # :path: a served name may hold slashes (a --model path, org/name)
    async def model(model: str) -> JSONResponse:
        client.check_model(model)  # another name: 404 model_not_found
        return JSONResponse(card)

    async def reset_prefix_cache() -> JSONResponse:
        """The prefix cache's pages that no running request holds are dropped (a benchmark's next run starts cold,
        as bench-offline's runs do in-process); the pages of requests in flight stay. Answered once it is done."""
        if not await remote.clear_cache():
            if remote.alive:  # a step longer than the wait (a long prefill on a CPU): it happens when that step ends
                raise APIError(504, "the engine has not reached its next step yet: the cache is dropped at that step")
            raise APIError(503, f"engine is not running: {remote.error or 'stopped'}")
        after = await remote.metrics()  # taken after that step: what the cache holds now
        return JSONResponse({"status": "ok", "kv_pages_cached": None if after is None else after.kv_pages_cached})

    # vLLM's name and SGLang's (SGLang takes GET too)
    app.add_api_route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"])
    app.add_api_route("/flush_cache", reset_prefix_cache, methods=["GET", "POST"])

    @app.get("/metrics")
    async def metrics(_: Request) -> PlainTextResponse:
        engine, age = await client.engine_metrics()
        text = client.metrics.render(engine, client.in_flight, age)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
