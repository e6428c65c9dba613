"""``create_app(settings)``: the FastAPI app; its lifespan owns the InferenceService."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api import errors, health, predict, v2
from app.api.access import AccessLog
from app.config import ConfigError, Settings, load_settings
from app.metrics import Metrics
from app.models.base import ModelHandler
from app.models.registry import load_handler
from app.service import InferenceService, resolve_devices


class BatchServeApp(FastAPI):
    """FastAPI, plus a direct path for the hot route: ``POST /predict`` goes to the same handler
    code without the framework's routing and middleware layers (docs/benchmarks.md: that stack
    was ~60% of the event loop's time per request)."""

    fast_predict: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.fast_predict is not None and scope["type"] == "http"
                and scope["path"] == "/predict" and scope["method"] == "POST"):
            scope["app"] = self
            await self.fast_predict(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None, handler: ModelHandler | None = None) -> FastAPI:
    """Build the app. With no settings they are read from the environment (uvicorn --factory)."""
    settings = settings if settings is not None else load_settings()
    try:
        devices = resolve_devices(settings.devices)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    handler = handler if handler is not None else load_handler(settings.model, settings.model_name)
    metrics = Metrics.create()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = InferenceService(settings, handler, metrics, devices)
        await service.start()
        app.state.service = service
        try:
            yield
        finally:
            await service.stop()

    app = BatchServeApp(
        title="batchserve",
        summary=f"Dynamic-batching inference server for model {handler.name!r}",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.handler = handler
    app.state.service = None
    errors.install(app)
    app.include_router(predict.router(handler.input_schema))
    app.include_router(health.router)
    app.include_router(v2.router)
    app.add_middleware(AccessLog)
    app.fast_predict = AccessLog(predict.predict_asgi)
    return app
