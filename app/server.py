"""``batchserve serve``: uvicorn around the app (app/draining.py).

One process (``--frontends 1``), or a device process with N front-end processes on one
listening address (docs/frontends.md); a front end runs app/frontend/entry.py's ``run``.
"""

from __future__ import annotations

import logging
import os
import socket
import types
from functools import partial

import uvicorn

from app.arriving import receiving_bytes
from app.asks import answer
from app.bridge import Bridge
from app.config import Settings, drain_limit_s
from app.draining import Drainable, DrainingServer, server_config
from app.errors import os_reason
from app.grpc.listener import GrpcListener, reserved
from app.grpc.listener import address as grpc_address
from app.listening import for_frontends, listening_socket, url_of
from app.logs import configure_logging
from app.main import create_app
from app.process import fit_open_files, fit_torch_threads, tune_for_serving
from app.sources import unknown_variables
from app.supervisor import Frontends, frontend_count

log = logging.getLogger("batchserve")


class DeviceServer(DrainingServer):
    """The device process: the whole app, answering what the front ends ask over their links
    (``bridge``) and the front-end processes themselves (``frontends``). SIGTERM drains the front
    ends first; the server is settled once they have all exited and nothing is in flight."""

    def __init__(self, config: uvicorn.Config, service: Drainable, drain_limit_s: float,
                 frontends: Frontends) -> None:
        super().__init__(config, service, drain_limit_s)  # gRPC: the front ends serve it
        self.frontends = frontends

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            try:
                self.frontends.start()
            except OSError as exc:  # no process can be started (a pids or memory limit)
                self.stop_fatally(f"cannot start the front ends: {os_reason(exc)}")

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
    fit_open_files(settings.max_connections, grpc=bool(settings.grpc_port))
    fit_torch_threads()
    count = frontend_count(settings.frontends)
    # Each process that takes HTTP requests gets its share of the room for arriving bodies.
    settings = settings.model_copy(
        update={"max_receiving_bytes": receiving_bytes(settings, count)})
    if count > 1:
        return _serve_split(settings, count, fd)
    listener = listening_socket(settings.host, settings.port, fd, group=False)
    with reserved(settings.host, settings.grpc_port):
        app = create_app(settings)
        service = app.state.service
        grpc = GrpcListener(settings, service, partial(answer, app)) \
            if settings.grpc_port else None
        server = DrainingServer(server_config(settings, app), service, drain_limit_s(settings),
                                grpc)
        log.info("listening on %s%s", url_of(listener), _grpc_text(settings))
        server.run(sockets=[listener])
        return 0 if server.started and not server.fatal else 1


def _serve_split(settings: Settings, count: int, fd: int | None) -> int:
    """The device process: binds (or inherits) the listening socket, and one more for each
    other front end beside it where it can (app/listening.py), and runs ``count`` front ends,
    one on each listening socket. Its app answers what they ask over their links (app/asks.py);
    uvicorn runs its lifespan and its drain, with no socket of its own."""
    listener = listening_socket(settings.host, settings.port, fd, group=True)
    listeners = for_frontends(listener, count)
    try:
        with reserved(settings.host, settings.grpc_port):
            app = create_app(settings, behind_frontends=True)
            service = app.state.service
            frontends = Frontends(settings, listeners, Bridge(service, count, app))
            server = DeviceServer(server_config(settings, app), service,
                                  drain_limit_s(settings), frontends)
            log.info("listening on %s%s with %d front ends", url_of(listener),
                     _grpc_text(settings), count)
            server.run(sockets=[])
            return 0 if server.started and not server.fatal else 1
    finally:
        for sock in set(listeners):
            sock.close()


def _grpc_text(settings: Settings) -> str:
    if not settings.grpc_port:
        return ""
    return f" and grpc://{grpc_address(settings.host, settings.grpc_port)}"
