"""Open Inference Protocol v2 routes (KServe v2 / Triton HTTP): health, metadata and Triton's
model configuration; inference is app/api/v2/infer.py's.

Errors here use the protocol's ``{"error": "..."}`` body and 400 for client mistakes (V2Route).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response

from app.api.deps import CountedServiceDep, ServiceDep
from app.api.error_responses import V2Route
from app.api.v2 import describe
from app.api.v2.infer import ERROR_BODY
from app.runtime import InferenceService
from app.served import ServedModel
from app.version import __version__

# Inference is app/api/v2/infer.py's, served by every front end itself; ``router``: the rest.
router = APIRouter(prefix="/v2", tags=["Open Inference Protocol v2"], route_class=V2Route)


async def _model(service: ServiceDep, request: Request, name: str) -> ServedModel:
    """The model version a route's path names (404 if there is none): the version only from
    the path, as the protocol puts it, never from a query."""
    return service.repository.get(name, request.path_params.get("version"))


ModelDep = Annotated[ServedModel, Depends(_model)]


def _versions(service: InferenceService, name: str) -> list[ServedModel]:
    """Every version of ``name`` the repository holds, by number."""
    return sorted((m for m in service.repository.models() if m.name == name),
                  key=lambda m: int(m.version))


def _view(model: ServedModel, service: InferenceService) -> describe.ModelView:
    versions = [m.version for m in _versions(service, model.name)]
    return describe.ModelView(
        name=model.name, version=model.version, versions=versions, input=model.input_spec,
        outputs=model.output_specs, max_batch_size=model.batch_limit, devices=model.devices,
        settings=model.settings,
    )


_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "unknown model", "content": ERROR_BODY}
}


@router.get("", summary="Server metadata")
async def server_metadata() -> dict[str, Any]:
    return {"name": "batchserve", "version": __version__,
            "extensions": ["binary_tensor_data", "model_configuration", "model_repository",
                           "statistics"]}


@router.get("/health/live", summary="200 while the process runs, 503 while a device thread "
            "is stuck in one call (past device_timeout_s) or its device is broken",
            responses={503: {"description": "not live: a restart is the remedy"}})
async def live(service: ServiceDep) -> Response:
    ok = service.live
    return JSONResponse({"live": ok}, status_code=200 if ok else 503)


@router.get("/health/ready", summary="200 when ready to serve, else 503",
            responses={503: {"description": "loading, draining or unhealthy"}})
async def ready(service: ServiceDep) -> Response:
    ok = service.status in ("ready", "busy")
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


# Before /models/{name}, which would take "stats" for a model's name (Triton reads it so too).
@router.get("/models/stats", summary="Every model version's statistics (Triton's extension)")
async def all_statistics(service: CountedServiceDep) -> dict[str, Any]:
    return _statistics(service.repository.models())


@router.get("/models/{name}/stats", summary="A model's statistics, each version's (Triton's "
            "extension)", responses=_NOT_FOUND)
@router.get("/models/{name}/versions/{version}/stats", include_in_schema=False)
async def model_statistics(model: ModelDep, service: CountedServiceDep, request: Request
                           ) -> dict[str, Any]:
    if "version" in request.path_params:
        return _statistics([model])
    return _statistics(_versions(service, model.name))


def _statistics(models: list[ServedModel]) -> dict[str, Any]:
    """Triton's ``model_stats`` of ``models`` (app/statistics.py), by name and version."""
    ordered = sorted(models, key=lambda m: (m.name, int(m.version)))
    return {"model_stats": [m.metrics.statistics.view(m.name, m.version) for m in ordered]}


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
