"""POST /predict: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out.

A raw ASGI route (app/api/routing.py): the server's hottest path. Its OpenAPI entry comes from
``openapi_operation``.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api.inference import run_inference
from app.api.routing import RawRoute
from app.payload import instances_of, parse_json
from app.schemas import ErrorResponse, PredictRequest, PredictResponse
from app.service import InferenceService

_ERRORS = {
    401: "missing or wrong bearer token",
    413: "body or instance count over the limit",
    422: "malformed body or instance",
    500: "the model failed on this request's batch",
    503: "busy, loading or draining; see Retry-After",
    504: "deadline passed before the answer",
}


def _render(results: list[Any], _: None) -> Response:
    content = orjson.dumps({"predictions": results}, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, media_type="application/json")


class Predict:
    """The endpoint: an instance, not a function, so Starlette mounts it as raw ASGI."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.max_instances = service.settings.max_instances

    def parse(self, body: bytes) -> tuple[list[Any], None]:
        return instances_of(parse_json(body), self.max_instances), None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await run_inference(scope, receive, self.service, self.parse, _render)
        await response(scope, receive, send)


def route(service: InferenceService) -> RawRoute:
    operation = openapi_operation(service.handler.input_schema)
    return RawRoute("/predict", Predict(service), "POST", operation)


def openapi_operation(instance_schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI operation of POST /predict, with the model's per-instance schema."""
    body = PredictRequest.model_json_schema()
    body["properties"]["instances"]["items"] = instance_schema
    ref = "#/components/schemas/"
    responses: dict[str, Any] = {
        "200": {"description": "one prediction per instance, in order",
                "content": {"application/json": {"schema": {"$ref": ref + "PredictResponse"}}}},
    }
    for status, text in _ERRORS.items():
        responses[str(status)] = {
            "description": text,
            "content": {"application/json": {"schema": {"$ref": ref + "ErrorResponse"}}},
        }
    return {
        "summary": "Run the model on a list of instances",
        "operationId": "predict",
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": responses,
    }


def openapi_components() -> dict[str, Any]:
    """Schemas the operation refers to, for ``components/schemas``."""
    out: dict[str, Any] = {}
    for model in (PredictResponse, ErrorResponse):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out
