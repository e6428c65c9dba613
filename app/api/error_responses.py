"""The one place exceptions become HTTP responses.

Each protocol renders its own error body: batchserve's routes ``{"error": {"type", "message"}}``,
the Open Inference Protocol's ``{"error": "..."}`` with 400 for every client mistake (as Triton and
KServe answer). A route says which it speaks by its ``error_format`` attribute (``V2Route``); a
path no route matched, by its prefix (``/v2``: the protocol's).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import Scope

from app.api.body import CLIENT_CLOSED, ClientGone
from app.errors import ServeError, bounded

_HTTP_TYPES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


@dataclass(frozen=True)
class ErrorFormat:
    """How one protocol writes an error: the body, and the status of a client mistake."""

    nested: bool  # {"error": {"type", "message"}} rather than {"error": "message"}
    invalid_status: int  # what 422 (a malformed request) becomes

    def status_of(self, status: int) -> int:
        """The status this protocol answers for an error of ``status``."""
        return self.invalid_status if status == 422 else status

    def render(self, status: int, type_: str, message: str,
               headers: dict[str, str] | None = None) -> Response:
        status = self.status_of(status)
        message = bounded(message)
        payload = {"error": {"type": type_, "message": message} if self.nested else message}
        return Response(orjson.dumps(payload), status_code=status,
                        media_type="application/json", headers=headers)


BATCHSERVE = ErrorFormat(nested=True, invalid_status=422)
V2 = ErrorFormat(nested=False, invalid_status=400)


class V2Route(APIRoute):
    """A FastAPI route of the Open Inference Protocol: its errors use the protocol's form."""

    error_format = V2


def format_of(scope: Scope) -> ErrorFormat:
    """The error form of the route that matched ``scope``; when none did, the protocol its path
    names (a client of the v2 protocol reads ``{"error": "..."}`` even for a 404)."""
    fmt: ErrorFormat | None = getattr(scope.get("route"), "error_format", None)
    return fmt or format_for_path(scope.get("path", ""))


def format_for_path(path: str) -> ErrorFormat:
    """The error form of the protocol whose routes ``path`` is among."""
    return V2 if path == "/v2" or path.startswith("/v2/") else BATCHSERVE


def error_response(exc: Exception, fmt: ErrorFormat = BATCHSERVE) -> Response:
    """The response for any exception, in ``fmt``. Unexpected ones become a generic 500 (the
    server logs their traceback; nothing of it reaches the client)."""
    if isinstance(exc, ServeError):
        headers = {}
        if exc.retry_after_s is not None:
            headers["Retry-After"] = str(exc.retry_after_s)
        if exc.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return fmt.render(exc.status, exc.type, exc.message, headers)
    if isinstance(exc, HTTPException):
        type_ = _HTTP_TYPES.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if "Allow" in headers:  # Starlette joins a set: one order, whatever the hash seed
            headers["Allow"] = ", ".join(sorted(headers["Allow"].split(", ")))
        return fmt.render(exc.status_code, type_, str(exc.detail), headers)
    if isinstance(exc, RequestValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()))
            parts.append(f"{loc}: {err.get('msg', 'invalid')}")
        return fmt.render(422, "invalid_input", "; ".join(parts) or "invalid request")
    return fmt.render(500, "internal_error", "internal server error")


async def _handle(request: Request, exc: Exception) -> Response:
    return error_response(exc, format_of(request.scope))


def install(app: FastAPI) -> None:
    for kind in (ServeError, HTTPException, RequestValidationError, Exception):
        app.add_exception_handler(kind, _handle)
    app.add_exception_handler(ClientGone, _gone)


async def _gone(request: Request, exc: Exception) -> Response:
    """A client that left before its request was whole: no one reads this answer."""
    return Response(status_code=CLIENT_CLOSED)
