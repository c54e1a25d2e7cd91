"""Errors in the OpenAI shape {"error": {"message", "type", "param", "code"}}, for every failure the server
answers, so clients see one format whether pydantic, the engine or the server itself refused a request."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("minisgl.server")

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, type: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def _is_union_tag(part: object) -> bool:
    # pydantic names each member of a union in the error location: ('prompt', 'list[int]', 1)
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool"))


def validation_error(exc: RequestValidationError) -> APIError:
    """pydantic/JSON problems -> 400 naming the offending field (locations look like ('body', field, ...))."""
    errors = exc.errors()
    err = errors[0]
    if err.get("type") == "json_invalid":
        return APIError(
            400, f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}", code="json_invalid"
        )
    full = list(err.get("loc", ()))
    loc = full[1:] if full[:1] == ["body"] else []
    if not loc:  # the body itself: a JSON list, or text sent as text/plain (FastAPI reads JSON types only as JSON)
        if err.get("type") == "model_attributes_type":
            message = "request body must be a JSON object, sent as application/json"
        else:
            message = f"request body: {err.get('msg')}"
        return APIError(400, message, code=err.get("type"))
    tag = next((i for i, p in enumerate(loc) if _is_union_tag(p)), None)
    where = ".".join(str(p) for p in (loc if tag is None else loc[:tag]))
    code = err.get("type")
    if tag is None:
        why = err.get("msg")
    else:  # a union: say which shapes are accepted instead of why the first one failed
        shapes = dict.fromkeys(e["loc"][tag + 1] for e in errors if list(e["loc"][1 : tag + 1]) == loc[:tag])
        why, code = "expected " + " or ".join(shapes), "invalid_type"
    got = "" if err.get("type") == "missing" else f" (got {err.get('input')!r:.200})"
    return APIError(400, f"{where}: {why}{got}", param=str(loc[0]), code=code)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, (UnicodeDecodeError, RecursionError)):
            # FastAPI's "There was an error parsing the body", where json.loads gave up before its own JSON errors
            why = "not UTF-8" if isinstance(cause, UnicodeDecodeError) else "nested too deeply"
            return APIError(400, f"malformed JSON body: {why}", code="json_invalid").response()
        response = APIError(exc.status_code, str(exc.detail)).response()
        response.headers.update(exc.headers or {})  # a 405's Allow, which HTTP requires
        return response

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return APIError(500, f"internal server error: {type(exc).__name__}: {exc}").response()
