"""Request ids and the access log: a pure ASGI middleware (no per-request task or copy).

The id comes from the client's ``X-Request-ID`` (if sane) or is generated; it is echoed in the
response and attached to every log line written while the request is handled. Health probes are
logged when their answer changes (else at debug level).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.logs import request_id

REQUEST_ID_HEADER = b"x-request-id"
# Load balancers and kubelets probe these every few seconds: an answer like the last one is
# logged at debug level only.
HEALTH_PATHS = frozenset({"/health_check", "/v2/health/ready", "/v2/health/live"})

_SANE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")

log = logging.getLogger("batchserve.access")


class RequestIds:
    """A request's id: the client's own if sane, else a new one (a random per-process prefix
    and a counter: uuid4 costs a syscall each)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count(1)

    def take(self, given: str | None) -> str:
        if given is not None and _SANE.match(given):
            return given
        return f"{self._prefix}{next(self._counter):016x}"


class AccessLog:
    def __init__(self, app: ASGIApp, level: int = logging.INFO) -> None:
        """``level``: of each access line (a probe answering as before: debug)."""
        self.app = app
        self.level = level
        self._ids = RequestIds()
        self._health: dict[str, int] = {}  # each probe path's last status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                given = value.decode("latin-1")
                break
        rid = self._ids.take(given)
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), (REQUEST_ID_HEADER, rid.encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            level = self.level
            path = scope["path"]
            if path in HEALTH_PATHS:  # probes: logged when their answer changes
                if self._health.get(path) == status:
                    level = logging.DEBUG
                self._health[path] = status
            if log.isEnabledFor(level):
                client = scope.get("client")
                log.log(
                    level,
                    '%s "%s %s" %d %.1fms', client[0] if client else "-", scope["method"],
                    scope["path"], status, (time.perf_counter() - started) * 1000,
                    extra={"method": scope["method"], "path": scope["path"], "status": status,
                           "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                           "client": client[0] if client else None},
                )
            request_id.reset(token)
