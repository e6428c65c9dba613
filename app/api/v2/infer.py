"""Open Inference Protocol v2 inference (KServe v2 / Triton HTTP), with the binary tensor data
extension: ``POST /v2/models/{name}[/versions/{version}]/infer``, which every front end serves
itself (app/frontend/app.py).

Errors use the protocol's ``{"error": "..."}`` body and 400 for client mistakes.
"""

from __future__ import annotations

from typing import Any

from app.api.error_responses import V2
from app.api.headers import TIMEOUT_PARAMETER, priority_parameter
from app.api.inference import (
    Asked,
    InferenceEndpoint,
    Serving,
)
from app.api.rendered import Rendered
from app.api.routing import RawRoute
from app.api.v2.codec import (
    HEADER_LENGTH,
    InferRequest,
    encode_response,
    parse_request,
)
from app.arrays import Results
from app.facade import ModelFacade
from app.models.signature import DATATYPES, output_tensors

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
ERROR_BODY = {"application/json": {"schema": {
    "type": "object", "properties": {"error": {"type": "string"}}}}}
_INFER_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": ERROR_BODY}
    for status, text in [(400, "malformed request"), (401, "missing or wrong bearer token"),
                         (404, "unknown model"), (413, "body or rows over the limit"),
                         (415, "a Content-Encoding other than gzip or deflate"),
                         (500, "the model failed on this request's batch"),
                         (503, "busy, deadline (would be answered too late), loading or "
                               "draining; see Retry-After"),
                         (504, "deadline passed before the answer")]
}

_HEADER_LENGTH = HEADER_LENGTH.encode()  # as ASGI gives header names: bytes, lower case


def _parse(model: ModelFacade, body: bytes, headers: dict[bytes, bytes]
           ) -> tuple[list[Any], InferRequest, Asked]:
    length = headers.get(_HEADER_LENGTH)
    parsed = parse_request(body, length.decode("latin-1") if length is not None else None,
                           model.settings.max_instances, model.name, model.input_spec,
                           model.output_specs)
    timeout_s = parsed.timeout_us / 1e6 if parsed.timeout_us is not None else None
    return parsed.rows, parsed, Asked(parsed.priority, timeout_s)


def _render(model: ModelFacade, results: Results, parsed: InferRequest) -> Rendered:
    content, json_length = encode_response(model.name, model.version, parsed,
                                           output_tensors(results))
    if json_length is None:
        return Rendered(content, b"application/json")
    return Rendered(content, b"application/octet-stream",
                  ((b"inference-header-content-length", b"%d" % json_length),))


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
