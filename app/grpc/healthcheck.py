"""``grpc.health.v1.Health``, the standard health service (grpc_health_probe, kubelets' gRPC
probes): the server, or one model, as ``/health_check`` (``?model=``) answers for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2

from app.errors import ServeError
from app.grpc.calls import SERVICE, Malformed, Metadata, abort, calls, metadata_of
from app.grpc.control import Control

WATCH_EVERY_S = 1.0  # how often a Watch reads the status it streams
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]


class HealthServicer:
    """``grpc.health.v1``: the server (service ``""`` or the inference service's name) or one
    model (its name) is SERVING when ``/health_check`` (``?model=``) says ready, NOT_SERVING
    when busy, loading, draining or unhealthy; an unknown model is NOT_FOUND."""

    def __init__(self, control: Control) -> None:
        self.control = control

    async def _status(self, service: str, metadata: Metadata) -> int:
        params = None if service in ("", SERVICE.full_name) else {"model": service}
        _, body = await self.control.get("/health_check", metadata, params)
        serving = body.get("status") == "ready"
        status: int = health_pb2.HealthCheckResponse.SERVING if serving else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        return status

    @calls.rpc
    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext, metadata: Metadata
                    ) -> health_pb2.HealthCheckResponse:
        status = await self._status(request.service, metadata)
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext
                    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """The status now, then each change, until the client leaves."""
        if type(request) is Malformed:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.message)
        last = None
        metadata = metadata_of(context)
        while True:
            try:
                status = await self._status(request.service, metadata)
            except ServeError as exc:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN if exc.status == 404 \
                    else health_pb2.HealthCheckResponse.NOT_SERVING
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(WATCH_EVERY_S)
