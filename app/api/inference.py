"""The request flow shared by /predict and /v2/models/{name}/infer.

auth -> deadline -> size-limited body -> parse (protocol-specific) -> admit whole or refuse ->
decode -> enqueue -> await the results (dropping them if the client disconnects) -> render.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from app.api.body import read_body
from app.batching import PendingRequest
from app.config import Settings
from app.errors import InvalidInput, ServeError, Unauthorized
from app.metrics import Metrics
from app.service import InferenceService

TIMEOUT_HEADER = "x-request-timeout"
CLIENT_CLOSED = 499  # nginx's convention; never reaches the (gone) client, only metrics

Parsed = TypeVar("Parsed")


def check_auth(request: Request, api_key: str | None) -> None:
    """Constant-time bearer-token check; a no-op when no key is configured."""
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    ok = hmac.compare_digest(token.strip().encode(), api_key.encode())
    if scheme.lower() != "bearer" or not ok:
        raise Unauthorized("missing or invalid bearer token")


def request_timeout_s(request: Request, settings: Settings) -> float:
    """The server's timeout, shortened by an ``X-Request-Timeout`` header (seconds) if given."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return settings.request_timeout_s
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise InvalidInput(f"{TIMEOUT_HEADER} must be a positive number of seconds, got {raw!r}")
    return min(value, settings.request_timeout_s)


async def _cancel_on_disconnect(request: Request, pending: PendingRequest) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            pending.future.cancel()
            return


async def run_inference(
    request: Request,
    service: InferenceService,
    settings: Settings,
    metrics: Metrics,
    parse: Callable[[bytes], tuple[list[Any], Parsed]],
    render: Callable[[list[Any], Parsed], Response],
) -> Response:
    """Serve one inference request; ``parse`` gives (instances, context) for ``render``."""
    arrived = time.monotonic()
    status = 500
    try:
        check_auth(request, settings.api_key)
        deadline = arrived + request_timeout_s(request, settings)
        body = await read_body(request, settings.max_body_bytes)
        instances, context = parse(body)
        service.check_admissible(len(instances))  # refuse before paying for decoding
        items = await service.decode(instances)
        pending = service.enqueue(items, deadline)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, pending))
        try:
            results = await service.result(pending)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if watcher.done() and task is not None and not task.cancelling():
                status = CLIENT_CLOSED
                metrics.rejected.labels(reason="disconnected").inc()
                return Response(status_code=CLIENT_CLOSED)
            raise
        finally:
            watcher.cancel()
        response = render(results, context)
        status = response.status_code
        return response
    except ServeError as exc:
        status = exc.status
        if status != 500:
            metrics.rejected.labels(reason=exc.type).inc()
        raise
    finally:
        metrics.requests.labels(status=str(status)).inc()
        metrics.request_duration.observe(time.monotonic() - arrived)
