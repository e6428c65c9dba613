"""GET /health_check for load balancers, GET /metrics for Prometheus."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from app.api.deps import MetricsDep
from app.schemas import HealthResponse
from app.service import InferenceService

router = APIRouter()


@router.get(
    "/health_check",
    response_model=HealthResponse,
    responses={503: {"model": HealthResponse, "description": "busy, loading, draining, unhealthy"}},
    summary="ready (200), or busy / loading / draining / unhealthy (503)",
)
async def health_check(request: Request) -> Response:
    service: InferenceService | None = getattr(request.app.state, "service", None)
    if service is None:
        body = {"status": "loading", "queue_depth": 0,
                "queue_capacity": request.app.state.settings.queue_capacity}
    else:
        body = {"status": service.status, "queue_depth": service.queue_depth,
                "queue_capacity": service.settings.queue_capacity}
    ready = body["status"] == "ready"
    return Response(
        orjson.dumps(body),
        status_code=200 if ready else 503,
        media_type="application/json",
        headers=None if ready else {"Retry-After": "1"},
    )


@router.get("/metrics", summary="Prometheus metrics", response_model=None)
async def metrics(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
