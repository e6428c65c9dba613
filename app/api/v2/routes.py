"""Open Inference Protocol v2 routes (KServe v2 / Triton HTTP): health, metadata, Triton's model
configuration, and inference with the binary tensor data extension.

Errors here use the protocol's ``{"error": "..."}`` body and 400 for client mistakes (V2Route).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response

from app.api.deps import ServiceDep
from app.api.error_responses import V2, V2Route
from app.api.inference import (
    TIMEOUT_PARAMETER,
    Asked,
    InferenceEndpoint,
    Serving,
    priority_parameter,
)
from app.api.routing import RawRoute
from app.api.v2 import describe
from app.api.v2.codec import (
    HEADER_LENGTH,
    InferRequest,
    encode_response,
    parse_request,
)
from app.arrays import Results
from app.facade import ModelFacade
from app.models.signature import DATATYPES, output_tensors
from app.runtime import InferenceService
from app.served import ServedModel
from app.version import __version__

# Inference (``infer_routes``) is served by every front end itself (app/frontend/app.py);
# ``router``: the rest.
router = APIRouter(prefix="/v2", tags=["Open Inference Protocol v2"], route_class=V2Route)


async def _model(service: ServiceDep, request: Request, name: str) -> ServedModel:
    """The model version a route's path names (404 if there is none): the version only from
    the path, as the protocol puts it, never from a query."""
    return service.repository.get(name, request.path_params.get("version"))


ModelDep = Annotated[ServedModel, Depends(_model)]


def _view(model: ServedModel, service: InferenceService) -> describe.ModelView:
    versions = sorted((m.version for m in service.repository.models() if m.name == model.name),
                      key=int)
    return describe.ModelView(
        name=model.name, version=model.version, versions=versions, input=model.input_spec,
        outputs=model.output_specs, max_batch_size=model.batch_limit, devices=model.devices,
        settings=model.settings,
    )


_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        "datatype": {"type": "string", "enum": [*DATATYPES, "BYTES"]},
        "data": {"type": "array", "description": "row-major values (or nested lists)"},
        "parameters": {"type": "object", "properties": {"binary_data_size": {"type": "integer"}}},
    },
}
_INFER_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "inputs": {"type": "array", "items": _TENSOR, "minItems": 1, "maxItems": 1},
            "outputs": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"},
                "parameters": {"type": "object",
                               "properties": {"binary_data": {"type": "boolean"}}},
            }}},
            "parameters": {"type": "object", "properties": {
                "binary_data_output": {"type": "boolean"},
                "priority": {"type": "integer", "minimum": 0,
                             "description": "1 the most urgent, up to the model's "
                                            "priority_levels; 0: its default level"},
                "timeout": {"type": "integer", "minimum": 0,
                            "description": "microseconds from arrival to answer; shortens, "
                                           "never lengthens, the model's request_timeout_s; "
                                           "0: that timeout"},
            }},
        },
    }}},
}
_ERROR_BODY = {"application/json": {"schema": {
    "type": "object", "properties": {"error": {"type": "string"}}}}}
_INFER_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": _ERROR_BODY}
    for status, text in [(400, "malformed request"), (401, "missing or wrong bearer token"),
                         (404, "unknown model"), (413, "body or rows over the limit"),
                         (415, "a Content-Encoding other than gzip or deflate"),
                         (500, "the model failed on this request's batch"),
                         (503, "busy, deadline (would be answered too late), loading or "
                               "draining; see Retry-After"),
                         (504, "deadline passed before the answer")]
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "unknown model", "content": _ERROR_BODY}
}


@router.get("", summary="Server metadata")
async def server_metadata() -> dict[str, Any]:
    return {"name": "batchserve", "version": __version__,
            "extensions": ["binary_tensor_data", "model_configuration", "model_repository"]}


@router.get("/health/live", summary="200 while the process runs")
async def live() -> dict[str, Any]:
    return {"live": True}


@router.get("/health/ready", summary="200 when ready to serve, else 503")
async def ready(service: ServiceDep) -> Response:
    ok = service.status in ("ready", "busy")
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


@router.get("/models/{name}", summary="Model metadata", responses=_NOT_FOUND)
@router.get("/models/{name}/versions/{version}", include_in_schema=False)
async def model_metadata(model: ModelDep, service: ServiceDep) -> dict[str, Any]:
    return describe.metadata(_view(model, service))


@router.get("/models/{name}/config", summary="Model configuration (Triton's extension)",
            responses=_NOT_FOUND)
@router.get("/models/{name}/versions/{version}/config", include_in_schema=False)
async def model_config(model: ModelDep, service: ServiceDep) -> dict[str, Any]:
    return describe.config(_view(model, service))


@router.get("/models/{name}/ready", summary="200 when the model can serve, else 503",
            responses=_NOT_FOUND)
@router.get("/models/{name}/versions/{version}/ready", include_in_schema=False)
async def model_ready(model: ModelDep) -> Response:
    ok = model.health in ("ready", "busy")
    return JSONResponse({"name": model.name, "ready": ok}, status_code=200 if ok else 503)


_HEADER_LENGTH = HEADER_LENGTH.encode()  # as ASGI gives header names: bytes, lower case


def _parse(model: ModelFacade, body: bytes, headers: dict[bytes, bytes]
           ) -> tuple[list[Any], InferRequest, Asked]:
    length = headers.get(_HEADER_LENGTH)
    parsed = parse_request(body, length.decode("latin-1") if length is not None else None,
                           model.settings.max_instances, model.name, model.input_spec,
                           model.output_specs)
    timeout_s = parsed.timeout_us / 1e6 if parsed.timeout_us is not None else None
    return parsed.rows, parsed, Asked(parsed.priority, timeout_s)


def _render(model: ModelFacade, results: Results, parsed: InferRequest) -> Response:
    content, json_length = encode_response(model.name, model.version, parsed,
                                           output_tensors(results))
    if json_length is None:
        return Response(content, media_type="application/json")
    return Response(content, media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(json_length)})


_INFER_OPERATION = {
    "tags": ["Open Inference Protocol v2"],
    "summary": "Inference; each batch row is one item",
    "operationId": "infer",
    "parameters": [
        {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
        priority_parameter(), TIMEOUT_PARAMETER,
    ],
    "requestBody": _INFER_BODY,
    "responses": {
        "200": {"description": "the outputs; with binary outputs, a JSON header of "
                               "Inference-Header-Content-Length bytes, then the tensors",
                "content": {"application/json": {"schema": {"type": "object"}},
                            "application/octet-stream": {"schema": {}}}},
        **{str(status): answer for status, answer in _INFER_ERRORS.items()},
    },
}


def infer_routes(service: Serving) -> list[RawRoute]:
    """``POST /v2/models/{name}[/versions/{version}]/infer`` (the second not in the schema)."""
    endpoint = InferenceEndpoint(service, _parse, _render)
    return [
        RawRoute("/v2/models/{name}/infer", endpoint, "POST", _INFER_OPERATION, V2),
        RawRoute("/v2/models/{name}/versions/{version}/infer", endpoint, "POST", None, V2),
    ]
