"""``Annotated`` aliases that read the per-app objects from ``app.state``.

They are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in a thread pool, which
cost three thread hops per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.config import Settings
from app.errors import Unavailable
from app.metrics import Metrics
from app.service import InferenceService


async def _service(request: Request) -> InferenceService:
    service: InferenceService | None = getattr(request.app.state, "service", None)
    if service is None:
        raise Unavailable("loading", "the server is starting")
    return service


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


ServiceDep = Annotated[InferenceService, Depends(_service)]
SettingsDep = Annotated[Settings, Depends(_settings)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
