"""POST /predict: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out.

A raw ASGI route (app/api/routing.py): the server's hottest path. Its OpenAPI entry comes from
``openapi_operation``.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.api.headers import TIMEOUT_PARAMETER, priority_parameter
from app.api.inference import (
    NOTHING_ASKED,
    Asked,
    InferenceEndpoint,
    Serving,
)
from app.api.rendered import Rendered
from app.api.routing import RawRoute
from app.arrays import Results
from app.errors import InvalidInput, PayloadTooLarge
from app.facade import ModelFacade
from app.payload import (
    dense_instances,
    first_boolean,
    instances_of,
    may_hold_booleans,
    parse_json,
)
from app.schemas import ErrorResponse, PredictRequest, PredictResponse

_ERRORS = {
    401: "missing or wrong bearer token",
    404: "unknown model or version",
    413: "body (once inflated) or instance count over the limit",
    415: "a Content-Encoding other than gzip or deflate",
    422: "malformed body, instance or header",
    500: "the model failed on this request's batch",
    503: "busy, deadline (would be answered too late), loading, unloading or draining; see "
         "Retry-After",
    504: "deadline passed before the answer",
}


def _parse(model: ModelFacade, body: bytes, _: dict[bytes, bytes]) -> tuple[list[Any], None,
                                                                          Asked]:
    limit = model.settings.max_instances
    width = model.handler.dense_width
    if width is not None and (dense := dense_instances(body, width, limit)) is not None:
        return dense, None, NOTHING_ASKED
    payload = parse_json(body)
    try:
        instances = instances_of(payload, limit)
    except PayloadTooLarge:
        # One instance's numbers sent without its brackets read as that many instances: where
        # the first cannot be the model's, that is the mistake to name (a heavy decode is left
        # to the pool, never run here).
        first = payload["instances"][:1]
        if model.decodes_inline(first):
            model.handler.decode(first)
        raise
    if model.handler.input_datatype != "BYTES" and may_hold_booleans(body):
        index = first_boolean(instances)
        if index is not None:
            raise InvalidInput(f"instances[{index}]: expected numbers, got true or false")
    return instances, None, NOTHING_ASKED


def _render(_: ModelFacade, results: Results, __: None) -> Rendered:
    content = orjson.dumps({"predictions": results}, option=orjson.OPT_SERIALIZE_NUMPY)
    return Rendered(content, b"application/json")


def routes(service: Serving, default_schema: dict[str, Any],
           default_levels: int | None = None) -> list[RawRoute]:
    """``POST /predict`` and ``POST /models/{name}[/versions/{version}]/predict``. Where the
    server's one model is known when the routes are made (a single ``--model``), every route
    states its per-instance schema (``default_schema``) and priority levels
    (``default_levels``): it is the only model any of them serves."""
    endpoint = InferenceEndpoint(service, _parse, _render)
    return [
        RawRoute("/predict", endpoint, "POST",
                 openapi_operation(default_schema, "predict", levels=default_levels)),
        RawRoute("/models/{name}/predict", endpoint, "POST",
                 openapi_operation(default_schema, "predict_model", "name",
                                   levels=default_levels)),
        RawRoute("/models/{name}/versions/{version}/predict", endpoint, "POST",
                 openapi_operation(default_schema, "predict_model_version", "name", "version",
                                   levels=default_levels)),
    ]


def openapi_operation(instance_schema: dict[str, Any], operation_id: str,
                      *path: str, levels: int | None = None) -> dict[str, Any]:
    """The OpenAPI operation of a predict route with these ``path`` parameters, with the
    model's per-instance schema and, where known, its number of priority ``levels``."""
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
        "operationId": operation_id,
        "parameters": [
            *({"name": key, "in": "path", "required": True, "schema": {"type": "string"}}
              for key in path),
            priority_parameter(levels), TIMEOUT_PARAMETER,
        ],
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
