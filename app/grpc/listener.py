"""The gRPC listener of one serving process, started and stopped with its HTTP server.

Every process that serves HTTP inference (the single process, or each front end) serves gRPC
too, on ``grpc_port`` of the same host. Front ends share its port as they share the HTTP one:
each binds it with ``SO_REUSEPORT`` and the kernel spreads connections among them, while the
parent holds a bound (not listening) socket on it for the server's life, so the port stays the
server's while a front end is replaced (``reserved``).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health_pb2

from app.api.inference import Serving
from app.asks import Ask
from app.config import Settings
from app.errors import ConfigError, os_reason
from app.facade import refusals
from app.grpc.calls import SERVICE, CallLimit, method_table
from app.grpc.control import Control
from app.grpc.healthcheck import HEALTH, HealthServicer
from app.grpc.service import InferenceServicer


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextmanager
def reserved(host: str, port: int) -> Iterator[socket.socket | None]:
    """For the server's life, a socket bound to the gRPC port (None when ``port`` is 0, gRPC
    off): the listeners bind it beside this one with SO_REUSEPORT, so the port stays the
    server's while a front end is replaced. ConfigError, one line, if the port is taken: it
    is bound first without that option, so a port another program (or another batchserve)
    holds is refused rather than shared."""
    if not port:
        yield None
        return
    _bind(host, port, shared=False).close()
    sock = _bind(host, port, shared=True)
    try:
        yield sock
    finally:
        sock.close()


def _bind(host: str, port: int, shared: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As the HTTP port's (socket.create_server) and gRPC's own: a port whose last server's
        # connections wait out TIME_WAIT (up to a minute after a restart) is free to take.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {address(host, port)} for gRPC: "
                          f"{os_reason(exc)}") from None
    return sock


class GrpcListener:
    """``inference.GRPCInferenceService`` and ``grpc.health.v1.Health`` for ``service`` (this
    process's request path); ``ask`` has the app answer the other calls (app/grpc/control.py),
    ``changed`` is awaited after a load or unload through it."""

    def __init__(self, settings: Settings, service: Serving, ask: Ask,
                 changed: Callable[[], Awaitable[None]] | None = None) -> None:
        self.settings = settings
        self.service = service
        self._ask = ask
        self._changed = changed
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Listen (on the running loop); ConfigError if the port cannot be bound."""
        settings = self.settings
        control = Control(self._ask, self._changed)
        # A call holds memory from its headers on, before its message comes and ``limit``
        # below can see it (20,000 such streams on one connection: 422 MB). gRPC's own bound,
        # ``maximum_concurrent_rpcs``, refuses calls past it at their start: at twice
        # ``limit``, which frees a place as the answer is ready where gRPC's frees it only once
        # the answer has gone, a client of max_connections calls in a closed loop never meets
        # it.
        server = grpc.aio.server(options=[
            ("grpc.so_reuseport", 1),  # beside the reserved socket and the other front ends
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.max_send_message_length", -1),
            # gRPC core closes connections past this: without it a flood of idle ones took
            # every descriptor, and HTTP's connections were closed unanswered.
            ("grpc.max_allowed_incoming_connections", settings.max_connections),
        ], maximum_concurrent_rpcs=2 * settings.max_connections)
        # Calls past this get RESOURCE_EXHAUSTED, as connections past it get 503 over HTTP.
        limit = CallLimit(settings.max_connections, refusals(self.service.unknown, "grpc"))
        # Registered, not generic: grpcio's asyncio server takes a method's next call only once
        # its last was handed over, a pass of a busy loop or more each; a registered method has
        # its own such turn, so a health check does not wait behind a burst of inference calls
        # (docs/grpc.md).
        server.add_registered_method_handlers(
            SERVICE.full_name, method_table(InferenceServicer(self.service, control, limit), limit))
        server.add_registered_method_handlers(
            HEALTH.full_name, method_table(HealthServicer(control), limit, HEALTH, health_pb2))
        where = address(settings.host, settings.grpc_port)
        try:
            server.add_insecure_port(where)
        except RuntimeError:
            raise ConfigError(f"cannot listen on {where} for gRPC: "
                              f"{os.strerror(errno.EADDRINUSE)}") from None
        await server.start()
        self._server = server

    async def stop(self, grace_s: float) -> None:
        """Stop taking calls; those running get ``grace_s`` seconds to finish."""
        if self._server is not None:
            await self._server.stop(grace_s)
