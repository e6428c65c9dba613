"""POST /predict: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api.body import instances_of, parse_json
from app.api.deps import MetricsDep, ServiceDep, SettingsDep
from app.api.errors import error_response, serve_error_response
from app.api.inference import run_inference
from app.errors import ServeError, Unavailable
from app.schemas import ErrorResponse, PredictRequest, PredictResponse

log = logging.getLogger("batchserve.api")

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "missing or wrong bearer token"},
    413: {"model": ErrorResponse, "description": "body or instance count over the limit"},
    422: {"model": ErrorResponse, "description": "malformed body or instance"},
    500: {"model": ErrorResponse, "description": "the model failed on this request's batch"},
    503: {"model": ErrorResponse, "description": "busy, loading or draining; see Retry-After"},
    504: {"model": ErrorResponse, "description": "deadline passed before the answer"},
}


def _render(results: list[Any], _: None) -> Response:
    content = orjson.dumps({"predictions": results}, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, media_type="application/json")


async def predict_asgi(scope: Scope, receive: Receive, send: Send) -> None:
    """POST /predict without FastAPI's routing, middleware and dependency machinery.

    The same flow and error conversion as the documented route below (which serves the OpenAPI
    schema and stays the reference), at about half the event-loop time per request.
    """
    state = scope["app"].state
    service, settings, metrics = state.service, state.settings, state.metrics
    try:
        if service is None:
            raise Unavailable("loading", "the server is starting")

        def parse(body: bytes) -> tuple[list[Any], None]:
            return instances_of(parse_json(body), settings.max_instances), None

        response = await run_inference(scope, receive, service, settings, metrics, parse, _render)
    except ServeError as exc:
        response = serve_error_response(exc, scope["path"])
    except Exception:
        log.exception("unhandled error on POST /predict")
        response = error_response(500, "internal_error", "internal server error")
    await response(scope, receive, send)


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
        def parse(body: bytes) -> tuple[list[Any], None]:
            return instances_of(parse_json(body), settings.max_instances), None

        return await run_inference(
            request.scope, request.receive, service, settings, metrics, parse, _render
        )

    return api
