"""uvicorn's server with a drain phase for load balancers, as one process, the device process
(app/server.py) and each front end (app/frontend/entry.py) run it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
import types
from collections.abc import Iterator
from typing import Any, Protocol

import uvicorn

from app.accepting import Acceptor
from app.config import Settings, drain_limit_s
from app.connection import protocol_for
from app.errors import ConfigError
from app.facade import refusals
from app.grpc.listener import GrpcListener
from app.process import freeze_startup_objects

log = logging.getLogger("batchserve")

GRPC_GRACE_S = 1.0  # for calls still running once the drain is over (health, metadata)
# What the device process sends its front ends (app/supervisor.py): drain, then end the drain.
# Not SIGTERM: a front end also gets the signals sent to every process of the server (Ctrl-C
# in a terminal, systemd's default KillMode), and the device process's SIGTERM after its own
# would end its drain as a second signal does, closing its port to new connections.
DRAIN = signal.SIGUSR1
END_DRAIN = signal.SIGUSR2


class Drainable(Protocol):
    """What DrainingServer watches: an InferenceService, or a front end's RemoteService."""

    def begin_drain(self) -> None: ...

    @property
    def load_failed(self) -> bool: ...

    @property
    def load_error(self) -> str | None: ...

    @property
    def starting(self) -> bool: ...

    @property
    def status(self) -> str: ...

    @property
    def in_flight(self) -> int: ...


class DrainingServer(uvicorn.Server):
    """uvicorn's Server with a drain phase for load balancers.

    On SIGTERM/SIGINT the service starts draining at once: health says ``draining`` (503) and new
    requests get 503, while the listener stays open and accepted requests are answered. When none
    is left in flight (or after ``drain_limit_s``), uvicorn's own shutdown runs, and the process
    exits 0 instead of re-raising the signal. A second signal ends the drain at once: the
    listener closes, and uvicorn's shutdown still waits for what is in flight. A model that fails
    to load stops the server with exit code 1. Once every model is warm, the objects alive
    then are frozen out of the garbage collector's reach.
    """

    def __init__(self, config: uvicorn.Config, service: Drainable,
                 drain_limit_s: float, grpc: GrpcListener | None = None,
                 role: str = "", asked: bool = False) -> None:
        super().__init__(config)
        self.service = service
        self.asked = asked  # a front end: it takes DRAIN and END_DRAIN too
        # "front end": its lines say so, and its drain's course is logged at debug only (the
        # device process says the server's).
        self.role = f"{role}: " if role else ""
        self._say_drain = log.debug if role else log.info
        self._drain_said = False
        self.drain_limit_s = drain_limit_s
        self.grpc = grpc  # started after HTTP, stopped once nothing is left in flight
        self.drain_started: float | None = None
        self._signals = 0  # SIGTERM and SIGINT received
        self.fatal = False
        self.created = time.monotonic()
        self._frozen = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start, its sockets accepted by an ``Acceptor`` each (all connections
        waiting at once; uvloop's server takes one a pass of the loop: app/accepting.py)."""
        await super().startup(None if sockets is None else [])  # uvicorn serves none itself
        if self.started and sockets:
            # uvicorn types them as asyncio's Servers, and calls close and wait_closed alone
            self.servers = [Acceptor(sock, self._protocol) for sock in sockets]  # type: ignore[misc]
        if self.started and not self.should_exit and self.grpc is not None:
            try:
                await self.grpc.start()
            except ConfigError as exc:
                self.stop_fatally(exc.message)

    def _protocol(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn's start makes one for its own servers."""
        config = self.config
        protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=self.server_state, app_state=self.lifespan.state)
        return protocol

    def stop_fatally(self, reason: str) -> None:
        """Start could not finish: say why in one critical line, stop, exit 1."""
        log.critical("%s", reason)
        self.fatal = self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.grpc is not None:
            await self.grpc.stop(GRPC_GRACE_S)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's SIGTERM and SIGINT, and, ``asked``, the device process's DRAIN and
        END_DRAIN."""
        asks = {DRAIN: self.drain_asked, END_DRAIN: self.end_asked} if self.asked else {}
        before = {sig: signal.signal(sig, handler) for sig, handler in asks.items()}
        try:
            with super().capture_signals():
                yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
        """The first signal begins the drain (unless DRAIN has); the second ends it (a third
        SIGINT: uvicorn's forced exit). A front end counts only the signals sent to it, not
        its device process's asks, which come with them when every process is signalled, and
        may come first (Python runs a lower-numbered signal's handler first)."""
        self._signals += 1
        if self._signals > 1 or not self.started:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            return
        self.drain_asked()

    def drain_asked(self, sig: int = DRAIN, frame: types.FrameType | None = None) -> None:
        if not self.started:
            self.should_exit = True
        elif self.drain_started is None:
            self.service.begin_drain()
            self.drain_started = time.monotonic()

    def end_asked(self, sig: int = END_DRAIN, frame: types.FrameType | None = None) -> None:
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        service = self.service
        if service.load_failed:
            log.critical("%snothing can be served (%s); exiting", self.role, service.load_error)
            self.fatal = True
            return True
        # Start-up done, whatever the load (busy) or a SIGTERM since (draining) make of it.
        if not self._frozen and not service.starting and service.status != "unhealthy":
            freeze_startup_objects()
            self._frozen = True
            log.info("%sready in %.1f s", self.role, time.monotonic() - self.created)
        if self.drain_started is not None:
            waited = time.monotonic() - self.drain_started
            if not self._drain_said:
                self._drain_said = True
                self._say_drain("%sdraining: new requests refused; answering the %d in flight, "
                                "within %.0f s at most", self.role, service.in_flight,
                                self.drain_limit_s)
            if self.settled():
                self._say_drain("%sdrained in %.1f s", self.role, waited)
                return True
            if waited > self.drain_limit_s:
                log.warning("%s%d requests unanswered when the drain's %.0f s were over; "
                            "shutting down", self.role, service.in_flight, self.drain_limit_s)
                return True
        should_exit: bool = await super().on_tick(counter)
        if should_exit and self.drain_started is not None and not self.settled():
            self._say_drain("%sdrain ended by a second signal; shutting down with %d in flight",
                            self.role, service.in_flight)
        return should_exit

    def settled(self) -> bool:
        """Every accepted request is answered."""
        return self.service.in_flight == 0


def server_config(settings: Settings, app: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        lifespan="on",
        # Each answer in one write; slow clients cut off (app/connection.py).
        http=protocol_for(settings.read_timeout_s,
                          refusals(app.state.service.unknown, "http")),
        # No WebSocket is served: an Upgrade to one is declined as h2c's is, answered in
        # HTTP/1.1 (app/connection.py), and the websockets library is never imported.
        ws="none",
        # uvicorn counts the connection asking among those open: N + 1 lets N be served.
        limit_concurrency=settings.max_connections + 1,
        timeout_keep_alive=settings.keep_alive_s,
        access_log=False,  # app.api.access logs each request, with its request id
        timeout_graceful_shutdown=int(drain_limit_s(settings)),
    )
