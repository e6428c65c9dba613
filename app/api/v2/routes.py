"""Open Inference Protocol v2 routes (KServe v2 / Triton HTTP): health, metadata, Triton's model
configuration, and inference with the binary tensor data extension.

Errors here use the protocol's ``{"error": "..."}`` body and 400 for client mistakes (V2Route).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response

import app as package
from app.api.deps import ServiceDep
from app.api.errors import V2Route
from app.api.inference import run_inference
from app.api.v2 import describe
from app.api.v2.codec import (
    HEADER_LENGTH,
    InferRequest,
    encode_response,
    output_tensors,
    parse_request,
)
from app.errors import NotFound
from app.models.signature import DATATYPES
from app.service import InferenceService

VERSION = "1"

router = APIRouter(prefix="/v2", tags=["Open Inference Protocol v2"], route_class=V2Route)


def _checked(service: InferenceService, name: str, version: str | None = None) -> None:
    if name != service.handler.name:
        raise NotFound(f"unknown model '{name}'; this server serves '{service.handler.name}'")
    if version is not None and version != VERSION:
        raise NotFound(f"model '{name}' has no version '{version}'; it has '{VERSION}'")


async def _model(service: ServiceDep, name: str, version: str | None = None
                 ) -> describe.ModelView:
    """The model a route's path names (404 if there is none)."""
    _checked(service, name, version)
    return describe.ModelView(
        name=service.handler.name, version=VERSION, versions=[VERSION],
        input=service.input_spec, outputs=service.outputs,
        max_batch_size=service.batch_limit, max_wait_ms=service.settings.max_wait_ms,
        devices=service.devices,
    )


ModelDep = Annotated[describe.ModelView, Depends(_model)]

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
            "parameters": {"type": "object",
                           "properties": {"binary_data_output": {"type": "boolean"}}},
        },
    }}},
}
_ERROR_BODY = {"application/json": {"schema": {
    "type": "object", "properties": {"error": {"type": "string"}}}}}
_INFER_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": _ERROR_BODY}
    for status, text in [(400, "malformed request"), (401, "missing or wrong bearer token"),
                         (404, "unknown model"), (413, "body or rows over the limit"),
                         (500, "the model failed on this request's batch"),
                         (503, "busy, loading or draining; see Retry-After"),
                         (504, "deadline passed before the answer")]
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "unknown model", "content": _ERROR_BODY}
}


@router.get("", summary="Server metadata")
async def server_metadata() -> dict[str, Any]:
    return {"name": "batchserve", "version": package.__version__,
            "extensions": ["binary_tensor_data", "model_configuration"]}


@router.get("/health/live", summary="200 while the process runs")
async def live() -> dict[str, Any]:
    return {"live": True}


@router.get("/health/ready", summary="200 when ready to serve, else 503")
async def ready(service: ServiceDep) -> Response:
    ok = service.status == "ready"
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


@router.get("/models/{name}", summary="Model metadata", responses=_NOT_FOUND)
@router.get("/models/{name}/versions/{version}", include_in_schema=False)
async def model_metadata(model: ModelDep) -> dict[str, Any]:
    return describe.metadata(model)


@router.get("/models/{name}/config", summary="Model configuration (Triton's extension)",
            responses=_NOT_FOUND)
@router.get("/models/{name}/versions/{version}/config", include_in_schema=False)
async def model_config(model: ModelDep) -> dict[str, Any]:
    return describe.config(model)


@router.get("/models/{name}/ready", summary="200 when the model can serve, else 503",
            responses=_NOT_FOUND)
@router.get("/models/{name}/versions/{version}/ready", include_in_schema=False)
async def model_ready(model: ModelDep, service: ServiceDep) -> Response:
    ok = service.status == "ready"
    return JSONResponse({"name": model.name, "ready": ok}, status_code=200 if ok else 503)


@router.post(
    "/models/{name}/infer",
    summary="Inference; each batch row is one item",
    openapi_extra={"requestBody": _INFER_BODY},
    responses=_INFER_ERRORS,
)
@router.post("/models/{name}/versions/{version}/infer", include_in_schema=False)
async def infer(request: Request, service: ServiceDep, model: ModelDep) -> Response:
    name = model.name
    header_length = request.headers.get(HEADER_LENGTH)
    max_rows = service.settings.max_instances

    def parse(body: bytes) -> tuple[list[Any], InferRequest]:
        parsed = parse_request(body, header_length, max_rows, name, service.input_spec,
                               service.outputs)
        return parsed.rows, parsed

    def render(results: list[Any], parsed: InferRequest) -> Response:
        content, json_length = encode_response(name, VERSION, parsed, output_tensors(results))
        if json_length is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(json_length)})

    return await run_inference(request.scope, request.receive, service, parse, render)
