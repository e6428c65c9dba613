"""Open Inference Protocol v2 routes (KServe v2 / Triton HTTP), binary tensor extension included.

Errors on these routes use the protocol's ``{"error": "..."}`` body (see app/api/errors.py) with
the same status codes as /predict.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.api.deps import MetricsDep, ServiceDep, SettingsDep
from app.api.inference import run_inference
from app.errors import NotFound
from app.models.base import ModelHandler
from app.v2 import HEADER_LENGTH, InferRequest, encode_response, output_tensors, parse_request

SERVER_VERSION = "0.1.0"
INPUT_NAME = "INPUT0"
OUTPUT_NAME = "OUTPUT0"


def _handler(request: Request, name: str) -> ModelHandler:
    handler: ModelHandler = request.app.state.handler
    if name != handler.name:
        raise NotFound(f"unknown model {name!r}; this server serves {handler.name!r}")
    return handler


def _status(request: Request) -> str:
    service = getattr(request.app.state, "service", None)
    return "loading" if service is None else str(service.status)


def _dims(shape: tuple[int, ...] | None) -> list[int]:
    return [-1, *shape] if shape is not None else [-1]


router = APIRouter(prefix="/v2", tags=["Open Inference Protocol v2"])

_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        "datatype": {"type": "string", "enum": ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64",
                                                "INT8", "INT16", "INT32", "INT64", "FP16",
                                                "FP32", "FP64", "BYTES"]},
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
_INFER_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "string"}}}}}}
    for status, text in [(401, "missing or wrong bearer token"), (404, "unknown model"),
                         (413, "body or rows over the limit"), (422, "malformed request"),
                         (500, "the model failed on this request's batch"),
                         (503, "busy, loading or draining; see Retry-After"),
                         (504, "deadline passed before the answer")]
}


@router.get("", summary="Server metadata")
async def server_metadata() -> dict[str, Any]:
    return {"name": "batchserve", "version": SERVER_VERSION, "extensions": ["binary_tensor_data"]}


@router.get("/health/live", summary="200 while the process runs")
async def live() -> dict[str, Any]:
    return {"live": True}


@router.get("/health/ready", summary="200 when ready to serve, else 503")
async def ready(request: Request) -> Response:
    ok = _status(request) == "ready"
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


@router.get("/models/{name}", summary="Model metadata")
@router.get("/models/{name}/versions/{version}", include_in_schema=False)
async def model_metadata(request: Request, name: str, version: str = "1") -> dict[str, Any]:
    handler = _handler(request, name)
    return {
        "name": handler.name,
        "versions": ["1"],
        "platform": "pytorch",
        "inputs": [{"name": INPUT_NAME, "datatype": handler.input_datatype,
                    "shape": _dims(handler.input_shape)}],
        "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32",
                     "shape": _dims(handler.output_shape)}],
    }


@router.get("/models/{name}/ready", summary="200 when the model can serve, else 503")
@router.get("/models/{name}/versions/{version}/ready", include_in_schema=False)
async def model_ready(request: Request, name: str, version: str = "1") -> Response:
    handler = _handler(request, name)
    ok = _status(request) == "ready"
    return JSONResponse({"name": handler.name, "ready": ok}, status_code=200 if ok else 503)


@router.post(
    "/models/{name}/infer",
    summary="Inference; each batch row is one item",
    openapi_extra={"requestBody": _INFER_BODY},
    responses=_INFER_ERRORS,
)
@router.post("/models/{name}/versions/{version}/infer", include_in_schema=False)
async def infer(
    request: Request, name: str, service: ServiceDep, settings: SettingsDep, metrics: MetricsDep,
    version: str = "1",
) -> Response:
    handler = _handler(request, name)
    header_length = request.headers.get(HEADER_LENGTH)

    def parse(body: bytes) -> tuple[list[Any], InferRequest]:
        parsed = parse_request(body, header_length, settings.max_instances)
        return parsed.rows, parsed

    def render(results: list[Any], parsed: InferRequest) -> Response:
        content, json_length = encode_response(
            handler.name, parsed, output_tensors(results, OUTPUT_NAME)
        )
        if json_length is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(json_length)})

    return await run_inference(
        request.scope, request.receive, service, settings, metrics, parse, render
    )
