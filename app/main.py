"""``create_app(settings)``: the FastAPI app around one InferenceService."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.api import error_responses as errors
from app.api import health, predict
from app.api.access import AccessLog
from app.api.docs import add_docs
from app.api.routing import BatchServeApp, RawRoute, get_alone
from app.api.v2 import repository_routes as v2_repository
from app.api.v2 import routes as v2
from app.api.v2.infer import infer_routes
from app.config import Settings
from app.models.base import ModelHandler
from app.runtime import InferenceService, build_service
from app.sources import load_settings
from app.version import __version__


def create_app(settings: Settings | None = None, handler: ModelHandler | None = None,
               behind_frontends: bool = False) -> FastAPI:
    """Build the app. With no settings they are read from the environment (uvicorn --factory).
    ``behind_frontends``: the device process's app, whose every request a front end took and
    logs, so its own access lines are at debug level.

    The service exists from here on (health says ``loading`` until its models are warm); the
    lifespan starts it and, on shutdown, drains and stops it. Raises ConfigError or
    ModelLoadError."""
    settings = settings if settings is not None else load_settings()
    service = build_service(settings, handler)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    access_level = logging.DEBUG if behind_frontends else logging.INFO
    app = BatchServeApp(
        access_level=access_level,
        title="batchserve",
        summary="Dynamic-batching inference server for PyTorch models",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,  # served below, from this machine
        redoc_url=None,
    )
    app.state.service = service
    errors.install(app)
    for route in [*predict.routes(service, *_single_model(service)), *infer_routes(service)]:
        app.add_raw_route(route)
    for router in (health.router, v2.router, v2_repository.router):
        app.add_router(router)
    add_docs(app)
    app.add_middleware(AccessLog, level=access_level)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _single_model(service: InferenceService) -> tuple[dict[str, Any], int | None]:
    """The per-instance schema and the priority levels of the server's one model, where it is
    known now (the single ``--model`` setting): every predict route serves it."""
    sources = service.repository.catalog.sources() if service.repository.catalog.single else {}
    for source in sources.values():
        if source.handler is not None and source.settings is not None:
            return source.handler.input_schema, source.settings.priority_levels
    return {}, None


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema of its own routes, plus the raw ASGI routes' operations."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                             routes=[get_alone(route) for route in app.routes])
        for route in app.routes:
            if isinstance(route, RawRoute) and route.include_in_schema:
                schema["paths"].setdefault(route.path, {}).update(route.operation)
        schema.setdefault("components", {}).setdefault("schemas", {}).update(
            predict.openapi_components()
        )
        app.openapi_schema = schema
    return app.openapi_schema

