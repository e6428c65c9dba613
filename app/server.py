"""``batchserve serve``: uvicorn around the app, with a drain phase for load balancers."""

from __future__ import annotations

import logging
import signal
import socket
import time
import types

import uvicorn

from app.config import Settings
from app.logs import configure_logging
from app.main import create_app
from app.process import freeze_startup_objects, tune_for_serving
from app.protocol import OneWriteProtocol
from app.service import InferenceService

log = logging.getLogger("batchserve")

DRAIN_MARGIN_S = 5.0  # beyond the request timeout, for the last answers to be written


class DrainingServer(uvicorn.Server):
    """uvicorn's Server with a drain phase for load balancers.

    On SIGTERM/SIGINT the service starts draining at once: health says ``draining`` (503) and new
    requests get 503, while the listener stays open and accepted requests are answered. When none
    is left in flight (or after ``drain_limit_s``), uvicorn's own shutdown runs, and the process
    exits 0 instead of re-raising the signal. A second signal skips the wait. A model that fails
    to load stops the server with exit code 1. Once every model is warm, the objects alive
    then are frozen out of the garbage collector's reach.
    """

    def __init__(self, config: uvicorn.Config, service: InferenceService,
                 drain_limit_s: float) -> None:
        super().__init__(config)
        self.service = service
        self.drain_limit_s = drain_limit_s
        self.drain_started: float | None = None
        self.fatal = False
        self._frozen = False

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
            log.critical("the model failed to load (%s); exiting", service.load_error)
            self.fatal = True
            return True
        if not self._frozen and service.status == "ready":
            freeze_startup_objects()
            self._frozen = True
        if self.drain_started is not None:
            waited = time.monotonic() - self.drain_started
            if service.in_flight == 0 or waited > self.drain_limit_s:
                return True
        should_exit: bool = await super().on_tick(counter)
        return should_exit


def serve(settings: Settings, fd: int | None = None) -> int:
    """Run the server until it is stopped; the process's exit code."""
    configure_logging(settings.log_level, settings.log_format)
    tune_for_serving()
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        lifespan="on",
        http=OneWriteProtocol,  # each answer in one write (app/protocol.py)
        access_log=False,  # app.api.access logs each request, with its request id
        timeout_graceful_shutdown=int(settings.request_timeout_s + DRAIN_MARGIN_S),
    )
    server = DrainingServer(config, app.state.service,
                            settings.request_timeout_s + DRAIN_MARGIN_S)
    # An inherited socket is wrapped with its real family (uvicorn's own --fd assumes AF_UNIX,
    # which leaves TCP_NODELAY off and costs ~40 ms per small response to delayed ACKs).
    server.run(sockets=[socket.socket(fileno=fd)] if fd is not None else None)
    return 0 if server.started and not server.fatal else 1
