"""The one place request errors become API bodies: a Cloudflare envelope or an OpenAI error.

Typed errors (edgefire.contract.errors) carry their code and HTTP status; anything else is an
internal error (3001, 500), logged with its traceback and never shown in detail. It is answered
by InternalErrorMiddleware rather than by Starlette's server-error handler, which re-raises and
makes the ASGI server drop the client's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgefire.contract.errors import (
    EdgefireError,
    InternalError,
    RequestTimeoutError,
    RouteError,
)

log = logging.getLogger(__name__)

# Paths whose clients speak OpenAI: the node's /ai/v1/ routes and, at the gateway, the
# Workers AI OpenAI routes behind a gateway and the unified compat endpoint.
OPENAI_PATH_MARKS = ("/ai/v1/", "/workers-ai/v1/", "/compat/chat/")

# OpenAI clients branch on `type`; statuses not listed here are server errors.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                 404: "invalid_request_error", 405: "invalid_request_error",
                 408: "timeout_error", 413: "invalid_request_error", 429: "rate_limit_error"}


def as_api_error(exc: BaseException) -> EdgefireError:
    if isinstance(exc, EdgefireError):
        return exc
    if isinstance(exc, HTTPException) and exc.status_code in (404, 405):
        return RouteError(exc.status_code)
    return InternalError()


def error_body(exc: EdgefireError, openai: bool) -> dict:
    if openai:
        return {"error": {"message": exc.message,
                          "type": _OPENAI_TYPES.get(exc.status, "server_error"),
                          "param": exc.field, "code": str(exc.code)}}
    return {"result": None, "success": False,
            "errors": [{"code": exc.code, "message": exc.message}], "messages": []}


def is_openai_path(path: str) -> bool:
    return any(mark in path for mark in OPENAI_PATH_MARKS)


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette exception handler for every route (and for requests no route matched)."""
    error = as_api_error(exc)
    return JSONResponse(error_body(error, is_openai_path(request.url.path)), error.status)


class InternalErrorMiddleware:
    """Answers an unexpected exception with 3001 and keeps the connection usable."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("internal error on %s %s", scope.get("method"), scope.get("path"))
            if started:  # mid-response: there is no clean way to answer any more
                raise
            body = error_body(InternalError(), is_openai_path(scope.get("path", "")))
            await JSONResponse(body, InternalError.status)(scope, receive, send)


@contextlib.asynccontextmanager
async def time_limit(seconds: float) -> AsyncIterator[None]:
    """Cancel the block after `seconds` and report it as Workers AI's timeout (3007)."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise RequestTimeoutError() from None
