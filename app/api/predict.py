"""POST /predict: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.body import instances_of, parse_json
from app.api.deps import MetricsDep, ServiceDep, SettingsDep
from app.api.inference import run_inference
from app.schemas import ErrorResponse, PredictRequest, PredictResponse

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

        return await run_inference(request, service, settings, metrics, parse, _render)

    return api
