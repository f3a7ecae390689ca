"""Typed HTTP errors: every failure leaves the server as `{"error": {code, message, type}}`.

Owns that envelope (`error_json`, the one writer of it: the handlers, the guard's refusals, an
error inside a stream, /predict's instances, the forwarder's 503) and the mapping from
exceptions (KvswapError, request validation, malformed bodies, unknown routes, a body past
`--max-body-bytes`, anything unexpected) to it, with the HTTP status equal to `code`.
Installed on the app by `install_error_handlers`; routes just raise. Anthropic's routes answer
the same errors in Anthropic's shape (`anthropic.errors` rewrites them).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from kvswap.core.errors import CONTEXT_LENGTH_EXCEEDED, ErrorKind, KvswapError, MindUnavailable
from kvswap.engine.client import ClientGone

log = logging.getLogger("kvswap.server")


class BodyTooLarge(Exception):
    """The request body went past --max-body-bytes while streaming in (the guard counts)."""


def error_json(
    kind: ErrorKind, message: str, status: int | None = None, **extra: object
) -> dict[str, Any]:
    """`{"error": {"code", "message", "type", **extra}}`: `code` is `status`, else the kind's."""
    body: dict[str, Any] = {"code": status or kind.code, "message": message, "type": kind.value}
    body.update(extra)
    return {"error": body}


def error_bytes(kind: ErrorKind, message: str, status: int | None = None, **extra: object) -> bytes:
    """`error_json` as the bytes of a JSON body."""
    return json.dumps(error_json(kind, message, status, **extra)).encode()


def error_response(
    kind: ErrorKind, message: str, status: int | None = None, **extra: object
) -> JSONResponse:
    """The typed error body with the HTTP status equal to its `code`."""
    return JSONResponse(error_json(kind, message, status, **extra), status_code=status or kind.code)


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            return "Invalid JSON in request body: " + str(
                err.get("ctx", {}).get("error", "parse error")
            )
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "Invalid request: " + "; ".join(parts)


_STATUS_KINDS = {
    400: ErrorKind.INVALID_REQUEST,
    401: ErrorKind.AUTHENTICATION,
    404: ErrorKind.NOT_FOUND,
    413: ErrorKind.INVALID_REQUEST,
    501: ErrorKind.NOT_SUPPORTED,
    503: ErrorKind.UNAVAILABLE,
}


def _openai_route(path: str) -> bool:
    """OpenAI's routes (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`, under any
    `--api-prefix`), where a too-long prompt's `code` is OpenAI's; llama-server's own routes
    keep the status there, and `/v1/messages` answers in Anthropic's shape."""
    return "/v1/" in path and "/v1/messages" not in path


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(KvswapError)
    async def _kvswap(request: Request, exc: KvswapError) -> JSONResponse:
        extra = exc.extra
        if exc.kind is ErrorKind.EXCEED_CONTEXT and _openai_route(request.url.path):
            extra = {**extra, "code": CONTEXT_LENGTH_EXCEEDED}  # what OpenAI's clients match
        answer = error_response(exc.kind, exc.message, None, **extra)
        retry_s = exc.extra.get("retry_after_s")
        if isinstance(retry_s, int | float):  # a refusal that passes: when to try again
            answer.headers["Retry-After"] = str(max(1, math.ceil(retry_s)))
        return answer

    @app.exception_handler(MindUnavailable)
    async def _retry_later(_: Request, exc: MindUnavailable) -> JSONResponse:
        retry_s = max(1, math.ceil(exc.retry_after_s))
        return JSONResponse(
            error_json(exc.kind, exc.message, retry_after_s=retry_s),
            status_code=exc.kind.code,
            headers={"Retry-After": str(retry_s)},
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(ErrorKind.INVALID_REQUEST, _describe_validation(exc))

    @app.exception_handler(json.JSONDecodeError)
    async def _json(_: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return error_response(ErrorKind.INVALID_REQUEST, f"Invalid JSON in request body: {exc}")

    @app.exception_handler(UnicodeDecodeError)
    async def _utf8(_: Request, exc: UnicodeDecodeError) -> JSONResponse:
        return error_response(ErrorKind.INVALID_REQUEST, "Invalid UTF-8 in request body")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # llama-server answers an unknown route or method alike: 404 "File Not Found".
        status = 404 if exc.status_code == 405 else exc.status_code
        kind = _STATUS_KINDS.get(status, ErrorKind.SERVER)
        message = "File Not Found" if status == 404 else str(exc.detail)
        return error_response(kind, message, status=status)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(_: Request, exc: BodyTooLarge) -> JSONResponse:
        return error_response(
            ErrorKind.INVALID_REQUEST, "request body is larger than the limit", status=413
        )

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)  # gone while its body was being read
    async def _gone(_: Request, exc: Exception) -> JSONResponse:
        # The client hung up and its work was cancelled; nobody reads this answer. Without
        # this handler each hang-up was logged as an unhandled error with two tracebacks.
        log.debug("client went away; its request was cancelled")
        return error_response(ErrorKind.INVALID_REQUEST, "the client went away")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(ErrorKind.SERVER, f"internal error: {type(exc).__name__}")
