"""GET /health_check for load balancers, GET /metrics for Prometheus."""

from __future__ import annotations

import orjson
from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from app.api.deps import ServiceDep
from app.schemas import HealthResponse

router = APIRouter()


@router.get(
    "/health_check",
    response_model=HealthResponse,
    responses={503: {"model": HealthResponse, "description": "busy, loading, draining, unhealthy"}},
    summary="ready (200), or busy / loading / draining / unhealthy (503)",
)
async def health_check(service: ServiceDep) -> Response:
    status = service.status
    body = {"status": status, "queue_depth": service.queue_depth,
            "queue_capacity": service.settings.queue_capacity}
    ready = status == "ready"
    return Response(
        orjson.dumps(body),
        status_code=200 if ready else 503,
        media_type="application/json",
        headers=None if ready else {"Retry-After": "1"},
    )


@router.get("/metrics", summary="Prometheus metrics", response_model=None)
async def metrics(service: ServiceDep) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
