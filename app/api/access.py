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
from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.logs import JsonFormatter, RequestIdFilter, TextFormatter, WriterHandler, request_id

REQUEST_ID_HEADER = b"x-request-id"
# Load balancers and kubelets probe these every few seconds: an answer like the last one is
# logged at debug level only.
HEALTH_PATHS = frozenset({"/health_check", "/v2/health/ready", "/v2/health/live"})

_SANE = re.compile(r"[A-Za-z0-9._:\-]{1,128}")  # whole: a "$" lets a trailing "\n" through

log = logging.getLogger("batchserve.access")


class RequestIds:
    """A request's id: the client's own if sane, else a new one (a random per-process prefix
    and a counter: uuid4 costs a syscall each)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count(1)

    def take(self, given: str | None) -> str:
        if given is not None and _SANE.fullmatch(given):
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

        def send_with_id(message: Message) -> Awaitable[None]:
            """``send``'s awaitable, not a coroutine of its own: no frame a message more."""
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), (REQUEST_ID_HEADER, rid.encode())]
                message = {**message, "headers": headers}
            return send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            level = self.level
            path = scope["path"]
            if path in HEALTH_PATHS:  # probes: logged when their answer changes
                if self._health.get(path) == status:
                    level = logging.DEBUG
                self._health[path] = status
            client = scope.get("client")
            log_access(level, client[0] if client else None, scope["method"], path, status,
                       (time.perf_counter() - started) * 1000)
            request_id.reset(token)


def log_access(level: int, client: str | None, method: str, path: str, status: int | str,
               duration_ms: float) -> None:
    """One access line, ``client "METHOD path" status 1.2ms`` (in JSON with those fields). Where
    configure_logging's handler is the only one the line would reach (a server's case; a
    test's capture adds its own), it is made straight from the fields and queued as the
    handler's ``emit`` would: logging's record, filters and locks were most of a line's cost,
    and at info a server writes one a request."""
    if not log.isEnabledFor(level):
        return
    shown = "-" if client is None else client if _plain(client) else f'"{_quoted(client)}"'
    message = (f'{shown} "{method} {path if _plain(path) else _quoted(path)}" {status} '
               f'{duration_ms:.1f}ms')
    writer = _sole_writer(level)
    formatter = writer.formatter if writer is not None else None
    if writer is not None and isinstance(formatter, TextFormatter):
        writer.queue(formatter.line(time.time(), logging.getLevelName(level), log.name,
                                    request_id.get(), message), level)
        return
    fields = {"method": method, "path": path, "status": status,
              "duration_ms": round(duration_ms, 3), "client": client}
    if writer is not None and isinstance(formatter, JsonFormatter):
        writer.queue(formatter.line(time.time(), logging.getLevelName(level), log.name, message,
                                    {"request_id": request_id.get(), **fields}), level)
        return
    log.log(level, "%s", message, extra=fields)


def _plain(text: str) -> bool:
    """Whether ``text`` goes in the text line as it is: nothing in it could end its field."""
    return '"' not in text and "\\" not in text and " " not in text


def _quoted(text: str) -> str:
    """``text`` with its quotes and backslashes escaped, as Apache's log writes them, so that a
    path (a decoded %22) or a forwarded client address cannot end its field and forge the
    fields after it, and a backslash of its own cannot read as one of escape_controls'
    escapes (``\\n``)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _sole_writer(level: int) -> WriterHandler | None:
    """The one handler an access record at ``level`` would reach, if it is a ``WriterHandler``
    whose one filter adds the request id (configure_logging's)."""
    logger = log
    while logger.parent is not None:  # up to the root
        if logger.handlers or logger.filters or not logger.propagate:
            return None
        logger = logger.parent
    handlers = logger.handlers
    if len(handlers) != 1 or not isinstance(writer := handlers[0], WriterHandler):
        return None
    plain = all(isinstance(f, RequestIdFilter) for f in writer.filters)
    return writer if plain and level >= writer.level else None
