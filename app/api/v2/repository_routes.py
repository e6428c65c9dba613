"""Triton's model repository extension: the index, load and unload (docs/models.md).

Load answers once the model is ready (200) or could not be loaded (400 with the reason); unload
once the model has drained and its replicas are released. Both need the API key when one is set.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.api.auth import check_auth
from app.api.body import read_inflated
from app.api.deps import ServiceDep
from app.api.error_responses import V2Route
from app.errors import InvalidInput
from app.payload import json_object
from app.runtime import InferenceService

router = APIRouter(prefix="/v2/repository", tags=["Model repository (Triton's extension)"],
                   route_class=V2Route)

def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The protocol's error answers these routes give, as OpenAPI responses."""
    return {status: {"description": _ERROR_TEXT[status], "content": {"application/json": {
        "schema": {"type": "object", "properties": {"error": {"type": "string"}}}}}}
        for status in statuses}


def _body_of(properties: dict[str, Any]) -> dict[str, Any]:
    """The optional JSON body these routes read (an empty one is ``{}``: tritonclient sends
    one), as the operation's OpenAPI ``requestBody``."""
    return {"requestBody": {"required": False, "content": {"application/json": {"schema": {
        "type": "object", "properties": properties}}}}}


def _parameters_of(properties: dict[str, Any]) -> dict[str, Any]:
    """A body's ``parameters`` object, which takes only ``properties``."""
    return {"parameters": {"type": "object", "properties": properties,
                           "additionalProperties": False}}


# The parameters each route takes: its schema, and the names it refuses any other than
# (``_parameters``).
_LOAD_PARAMETERS = {"config": {
    "anyOf": [{"type": "string"}, {"type": "object"}, {"type": "null"}],
    "description": "this model's settings as a JSON object, in a string as Triton sends it: "
                   "config.toml's keys but model (docs/models.md), e.g. "
                   "{\"max_batch_size\": 8}; null: none"}}
_UNLOAD_PARAMETERS = {"unload_dependents": {
    "type": "boolean", "description": "taken as Triton does; a model here has no dependents"}}


_ERROR_TEXT = {
    400: "malformed request, or the model could not be loaded",
    401: "missing or wrong bearer token",
    413: "body larger than max_body_bytes",
    503: "request bodies still arriving fill max_receiving_bytes (busy), or the server is "
         "shutting down; Retry-After says when to try again",
}


async def _body(request: Request, service: InferenceService) -> dict[str, Any]:
    """The request's JSON object; an empty body is an empty object (tritonclient sends one). A
    body past ``max_body_bytes`` is refused 413 as it arrives, not held whole; a
    client gone before its body came is ``ClientGone`` (nothing is done for it). A compressed
    one is inflated as an infer request's is."""
    headers = request.headers
    raw = await read_inflated(request.receive, service.settings.max_body_bytes,
                              headers.get("content-length", "").encode() or None,
                              headers.get("content-encoding", "").encode("latin-1") or None,
                              service.arriving)
    return json_object(raw) if raw.strip() else {}


def _parameters(body: dict[str, Any], allowed: dict[str, Any], action: str) -> dict[str, Any]:
    """The body's ``parameters``: an object whose names are all in ``allowed`` (the route's
    table, which its schema also shows)."""
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInput("'parameters' must be an object")
    unknown = sorted(set(params) - allowed.keys())
    if unknown:
        names = " or ".join(f"'{name}'" for name in allowed)
        raise InvalidInput(f"unsupported {action} parameters {unknown}; only {names} is")
    return params


def _true_or_false(values: dict[str, Any], key: str) -> bool:
    """``values[key]``, a JSON true or false; false where it is absent."""
    value = values.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"'{key}' must be true or false")
    return value


def _config(params: dict[str, Any]) -> dict[str, Any] | None:
    """The ``config`` parameter: this model's settings as JSON (a string, as Triton sends it)."""
    config = params.get("config")
    if config is None:
        return None
    if isinstance(config, str):
        return json_object(config, "'config'")
    if not isinstance(config, dict):
        raise InvalidInput("'config' must be a JSON object of model settings")
    return config


@router.post("/index", summary="Every model of the repository with its state",
             responses=_errors(400, 413, 503),
             openapi_extra=_body_of({"ready": {"type": "boolean", "description":
                                               "true: only the models ready to serve"}}))
async def index(request: Request, service: ServiceDep) -> Response:
    ready = _true_or_false(await _body(request, service), "ready")
    return JSONResponse(service.repository.index(ready))


@router.post("/models/{name}/load", summary="Load or reload a model; answers once it is ready",
             response_class=Response,
             responses={200: {"description": "ready (no body, as in Triton)"},
                        **_errors(400, 401, 413, 503)},
             openapi_extra=_body_of(_parameters_of(_LOAD_PARAMETERS)))
async def load(request: Request, service: ServiceDep, name: str) -> Response:
    check_auth(request.headers.get("authorization"), service.settings.api_key)
    config = _config(_parameters(await _body(request, service), _LOAD_PARAMETERS, "load"))
    await service.repository.load(name, config)
    return Response(status_code=200)


@router.post("/models/{name}/unload",
             summary="Unload a model: answers once its admitted requests are answered",
             response_class=Response,
             responses={200: {"description": "unloaded, or not loaded (no body)"},
                        **_errors(400, 401, 413, 503)},
             openapi_extra=_body_of(_parameters_of(_UNLOAD_PARAMETERS)))
async def unload(request: Request, service: ServiceDep, name: str) -> Response:
    check_auth(request.headers.get("authorization"), service.settings.api_key)
    params = _parameters(await _body(request, service), _UNLOAD_PARAMETERS, "unload")
    _true_or_false(params, "unload_dependents")  # checked only: nothing here has dependents
    await service.repository.unload(name)
    return Response(status_code=200)
