"""The one place exceptions become HTTP responses: ``{"error": {"type", "message"}}``."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from app.errors import ServeError

log = logging.getLogger("batchserve.api")

_HTTP_TYPES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def error_response(
    status: int,
    type_: str,
    message: str,
    headers: dict[str, str] | None = None,
    path: str = "",
) -> Response:
    """Our ``{"error": {"type", "message"}}``, or the v2 protocol's ``{"error": "..."}``."""
    detail: object = {"type": type_, "message": message}
    payload = {"error": message if path.startswith("/v2") else detail}
    body = orjson.dumps(payload)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def serve_error_response(exc: ServeError, path: str = "") -> Response:
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return error_response(exc.status, exc.type, exc.message, headers, path)


async def _on_serve_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServeError)
    return serve_error_response(exc, request.url.path)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    type_ = _HTTP_TYPES.get(exc.status_code, "http_error")
    return error_response(
        exc.status_code, type_, str(exc.detail), dict(exc.headers or {}), request.url.path
    )


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    message = "; ".join(parts) or "invalid request"
    return error_response(422, "invalid_input", message, path=request.url.path)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal server error", path=request.url.path)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ServeError, _on_serve_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
