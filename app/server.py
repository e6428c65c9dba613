"""``batchserve serve``: uvicorn around the app, with a drain phase for load balancers.

One process (``--frontends 1``), or a device process with N front-end processes on one
listening address (docs/frontends.md): ``serve`` picks, ``run_frontend`` is a front end's.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import types
from typing import Any, Protocol

import httpx
import torch
import uvicorn

from app.bridge import Bridge
from app.config import Settings
from app.connection import protocol_for
from app.errors import ConfigError
from app.frontend.app import create_frontend_app
from app.frontend.remote import RemoteService
from app.grpc.listener import GrpcListener, reserved
from app.grpc.listener import address as grpc_address
from app.listening import (
    for_frontends,
    listening_socket,
    private_socket,
    unix_address,
    url_of,
)
from app.logs import configure_logging
from app.main import create_app
from app.process import freeze_startup_objects, tune_for_serving
from app.sources import unknown_variables
from app.supervisor import Frontends, frontend_count

log = logging.getLogger("batchserve")

DRAIN_MARGIN_S = 5.0  # beyond the request timeout, for the last answers to be written
GRPC_GRACE_S = 1.0  # for calls still running once the drain is over (health, metadata)


class Drainable(Protocol):
    """What DrainingServer watches: an InferenceService, or a front end's RemoteService."""

    def begin_drain(self) -> None: ...

    @property
    def load_failed(self) -> bool: ...

    @property
    def load_error(self) -> str | None: ...

    @property
    def status(self) -> str: ...

    @property
    def in_flight(self) -> int: ...


class DrainingServer(uvicorn.Server):
    """uvicorn's Server with a drain phase for load balancers.

    On SIGTERM/SIGINT the service starts draining at once: health says ``draining`` (503) and new
    requests get 503, while the listener stays open and accepted requests are answered. When none
    is left in flight (or after ``drain_limit_s``), uvicorn's own shutdown runs, and the process
    exits 0 instead of re-raising the signal. A second signal skips the wait. A model that fails
    to load stops the server with exit code 1. Once every model is warm, the objects alive
    then are frozen out of the garbage collector's reach.
    """

    def __init__(self, config: uvicorn.Config, service: Drainable,
                 drain_limit_s: float, grpc: GrpcListener | None = None) -> None:
        super().__init__(config)
        self.service = service
        self.drain_limit_s = drain_limit_s
        self.grpc = grpc  # started after HTTP, stopped once nothing is left in flight
        self.drain_started: float | None = None
        self.fatal = False
        self.created = time.monotonic()
        self._frozen = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit and self.grpc is not None:
            try:
                await self.grpc.start()
            except ConfigError as exc:
                log.critical("%s", exc.message)
                self.fatal = self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.grpc is not None:
            await self.grpc.stop(GRPC_GRACE_S)
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
        if self.drain_started is not None or not self.started:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            return
        self.service.begin_drain()
        self.drain_started = time.monotonic()

    async def on_tick(self, counter: int) -> bool:
        service = self.service
        if service.load_failed:
            log.critical("nothing can be served (%s); exiting", service.load_error)
            self.fatal = True
            return True
        if not self._frozen and service.status == "ready":
            freeze_startup_objects()
            self._frozen = True
            log.info("ready in %.1f s", time.monotonic() - self.created)
        if self.drain_started is not None:
            waited = time.monotonic() - self.drain_started
            if self.settled() or waited > self.drain_limit_s:
                return True
        should_exit: bool = await super().on_tick(counter)
        return should_exit

    def settled(self) -> bool:
        """Every accepted request is answered."""
        return self.service.in_flight == 0


class DeviceServer(DrainingServer):
    """The device process: the whole app on a private Unix socket, the front ends' links
    (``bridge``) and the front-end processes themselves (``frontends``). SIGTERM drains the front
    ends first; the server is settled once they have all exited and nothing is in flight."""

    def __init__(self, config: uvicorn.Config, service: Drainable, drain_limit_s: float,
                 frontends: Frontends) -> None:
        super().__init__(config, service, drain_limit_s)  # gRPC: the front ends serve it
        self.frontends = frontends

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self.frontends.start()

    def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self.frontends.stop()

    def settled(self) -> bool:
        return not self.frontends.alive and super().settled()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.frontends.stop()
        await self.frontends.wait(self.drain_limit_s)
        await super().shutdown(sockets)


def serve(settings: Settings, fd: int | None = None) -> int:
    """Run the server until it is stopped; the process's exit code."""
    configure_logging(settings.log_level, settings.log_format)
    for warning in unknown_variables(os.environ):
        log.warning("%s", warning)
    tune_for_serving()
    count = frontend_count(settings.frontends)
    if count > 1:
        return _serve_split(settings, count, fd)
    listener = listening_socket(settings.host, settings.port, fd, group=False)
    with reserved(settings.host, settings.grpc_port):
        app = create_app(settings)
        service = app.state.service
        grpc = GrpcListener(settings, service, lambda: httpx.ASGITransport(app=app)) \
            if settings.grpc_port else None
        server = DrainingServer(_config(settings, app), service, _drain_limit_s(settings), grpc)
        log.info("listening on %s%s", url_of(listener), _grpc_text(settings))
        server.run(sockets=[listener])
        return 0 if server.started and not server.fatal else 1


def _config(settings: Settings, app: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        lifespan="on",
        # Each answer in one write; slow clients cut off (app/connection.py).
        http=protocol_for(settings.read_timeout_s or settings.request_timeout_s),
        limit_concurrency=settings.max_connections,
        access_log=False,  # app.api.access logs each request, with its request id
        timeout_graceful_shutdown=int(_drain_limit_s(settings)),
    )


def _drain_limit_s(settings: Settings) -> float:
    return settings.request_timeout_s + DRAIN_MARGIN_S


def _serve_split(settings: Settings, count: int, fd: int | None) -> int:
    """The device process: binds (or inherits) the listening socket, and one more for each
    other front end beside it where it can (app/listening.py), serves the whole app on a
    private Unix socket, and runs ``count`` front ends, one on each listening socket."""
    listener = listening_socket(settings.host, settings.port, fd, group=True)
    listeners = for_frontends(listener, count)
    try:
        with reserved(settings.host, settings.grpc_port), private_socket() as (private, address):
            app = create_app(settings, behind_frontends=True)
            service = app.state.service
            frontends = Frontends(settings, listeners, address, Bridge(service))
            server = DeviceServer(_config(settings, app), service, _drain_limit_s(settings),
                                  frontends)
            log.info("listening on %s%s with %d front ends", url_of(listener),
                     _grpc_text(settings), count)
            server.run(sockets=[private])
            return 0 if server.started and not server.fatal else 1
    finally:
        for sock in set(listeners):
            sock.close()


def _grpc_text(settings: Settings) -> str:
    if not settings.grpc_port:
        return ""
    return f" and grpc://{grpc_address(settings.host, settings.grpc_port)}"


def run_frontend(settings: Settings, listener: socket.socket, link: socket.socket,
                 device_socket: str) -> int:
    """One front end (app/frontend/entry.py) until SIGTERM or its device process is gone."""
    configure_logging(settings.log_level, settings.log_format)
    tune_for_serving()
    torch.set_num_threads(1)  # decoding only: the device process computes
    service = RemoteService(settings)
    device_socket = unix_address(device_socket)
    app = create_frontend_app(service, link, device_socket)
    grpc = GrpcListener(settings, service, lambda: httpx.AsyncHTTPTransport(uds=device_socket),
                      service.link.sync) if settings.grpc_port else None
    server = DrainingServer(_config(settings, app), service, _drain_limit_s(settings), grpc)
    server.run(sockets=[listener])
    return 0 if server.started and not server.fatal else 1
