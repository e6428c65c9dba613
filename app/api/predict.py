"""POST /predict: validate, admit whole or refuse, await the batched results."""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.body import instances_of, parse_json, read_body
from app.api.deps import MetricsDep, ServiceDep, SettingsDep
from app.batching import PendingRequest
from app.config import Settings
from app.errors import InvalidInput, ServeError, Unauthorized
from app.schemas import ErrorResponse, PredictRequest, PredictResponse

TIMEOUT_HEADER = "x-request-timeout"
CLIENT_CLOSED = 499  # nginx's convention; never reaches the (gone) client, only logs and metrics

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "missing or wrong bearer token"},
    413: {"model": ErrorResponse, "description": "body or instance count over the limit"},
    422: {"model": ErrorResponse, "description": "malformed body or instance"},
    500: {"model": ErrorResponse, "description": "the model failed on this request's batch"},
    503: {"model": ErrorResponse, "description": "busy, loading or draining; see Retry-After"},
    504: {"model": ErrorResponse, "description": "deadline passed before the answer"},
}


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


async def _cancel_on_disconnect(request: Request, request_state: PendingRequest) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            request_state.future.cancel()
            return


def router(instance_schema: dict[str, Any]) -> APIRouter:
    api = APIRouter()
    body_schema = PredictRequest.model_json_schema()
    body_schema["properties"]["instances"]["items"] = instance_schema

    @api.post(
        "/predict",
        response_model=PredictResponse,
        responses=_ERRORS,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": body_schema}},
            }
        },
        summary="Run the model on a list of instances",
    )
    async def predict(
        request: Request, service: ServiceDep, settings: SettingsDep, metrics: MetricsDep
    ) -> Response:
        arrived = time.monotonic()
        status = 500
        try:
            check_auth(request, settings.api_key)
            deadline = arrived + request_timeout_s(request, settings)
            body = await read_body(request, settings.max_body_bytes)
            instances = instances_of(parse_json(body), settings.max_instances)
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
            status = 200
            content = orjson.dumps({"predictions": results}, option=orjson.OPT_SERIALIZE_NUMPY)
            return Response(content, media_type="application/json")
        except ServeError as exc:
            status = exc.status
            if status != 500:
                metrics.rejected.labels(reason=exc.type).inc()
            raise
        finally:
            metrics.requests.labels(status=str(status)).inc()
            metrics.request_duration.observe(time.monotonic() - arrived)

    return api
