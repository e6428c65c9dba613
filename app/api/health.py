"""GET /health_check for load balancers, GET /metrics for Prometheus."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import PlainTextResponse, Response

from app.api.deps import CountedServiceDep, ServiceDep
from app.schemas import ErrorResponse, HealthResponse
from app.served import ServedModel

router = APIRouter()


def _answer(body: dict[str, object]) -> Response:
    ready = body["status"] == "ready"
    return Response(
        orjson.dumps(body),
        status_code=200 if ready else 503,
        media_type="application/json",
        headers=None if ready else {"Retry-After": "1"},
    )


@router.get(
    "/health_check",
    response_model=HealthResponse,
    responses={503: {"model": HealthResponse,
                     "description": "busy, loading, draining, unhealthy (or for ?model=: "
                                    "unloading, unavailable)"},
               404: {"model": ErrorResponse, "description": "?model= names no model"}},
    summary="ready (200), or busy / loading / draining / unhealthy (503); ?model=NAME: that one",
)
async def health_check(service: ServiceDep, model: str | None = None) -> Response:
    if model is not None:
        served = service.repository.get(model)
        return _answer({"status": served.health, **_model_state(served)})
    models = [_model_state(m) for m in service.repository.models()]
    return _answer({"status": service.status,
                    "queue_depth": sum(m["queue_depth"] for m in models),
                    "queue_capacity": sum(m["queue_capacity"] for m in models),
                    "models": models})


def _model_state(model: ServedModel) -> dict[str, Any]:
    """One model version's state, as the health check's body gives it."""
    return {"model": model.name, "version": model.version, "status": model.health,
            "queue_depth": model.queue.depth, "queue_capacity": model.settings.queue_capacity}


@router.get("/metrics", summary="Prometheus metrics (text exposition format)",
            response_model=None, response_class=PlainTextResponse)
async def metrics(service: CountedServiceDep) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
