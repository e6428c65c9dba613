"""What batchserve's HTTP protocol answers itself, before any route (app/connection.py): a
request whose head is over ``MAX_HEAD_BYTES`` (431), one that does not arrive within
``read_timeout_s`` (408), bytes that are not HTTP (400), each counted by ``count_refusal``; a
connection whose client takes none of its answer reset (app/flow.py); and the body of a request
whose Upgrade (h2c) is declined, read here. These are the rare paths; the protocol's per-request
path is app/connection.py's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.inference import CUT_OFF
from app.facade import Refusals
from app.flow import reset
from app.framing import Body, FramingError
from app.logs import INVALID_HTTP, STALLED
from app.refused import refusal

log = logging.getLogger("batchserve")

# The most bytes a request line and its headers may take (uvicorn sets no bound: a client could
# make the server hold gigabytes of one header). Past Node's 16 KiB and nginx's 32 KiB.
MAX_HEAD_BYTES = 64 * 1024


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the answers batchserve's gives itself (the module
    says which); ``OneWriteProtocol`` (app/connection.py) serves requests with it."""

    read_timeout_s: float | None = None
    count_refusal: Refusals | None = None
    _read_timer: asyncio.TimerHandle | None = None
    # What is being read and since when (the loop's time): the connection till its first
    # request begins ({}), then each request's scope till it is whole; None between requests
    # (uvicorn's keep-alive timer bounds those).
    _reading: tuple[float, Any] | None = None
    # The body of a request whose Upgrade (h2c) is declined, read here (app/framing.py).
    _declined: Body | None = None

    def _refuse_head(self) -> None:
        self._counted(431, "headers_too_large")
        self._cancel_read_timer()
        self._refuse(431, "Request Header Fields Too Large", "headers_too_large",
                     f"the request's line and headers are over {MAX_HEAD_BYTES} bytes",
                     getattr(self, "url", b"").decode("latin-1"))  # the path as it came

    def _upgrade(self, data: bytes, upgrade: httptools.HttpParserUpgrade) -> None:
        """uvicorn's, reading the body of a request whose Upgrade it declines (it dropped it:
        an h2c POST reached the app with an empty body)."""
        if self._should_upgrade():
            self.handle_websocket_upgrade()
        elif self._declined is not None:  # the body starts where llhttp stopped
            self._read_declined(data[upgrade.args[0]:])
        else:  # RFC 9110, 7.8: a server may ignore an Upgrade; this one answers in HTTP/1.1
            log.debug("upgrade to %s declined", self._get_upgrade())

    def _read_declined(self, data: bytes) -> None:
        body = self._declined
        assert body is not None
        try:
            pieces, rest = body.feed(data)
        except FramingError as exc:
            self.logger.warning(INVALID_HTTP)
            self.send_400_response(str(exc))
            return
        for piece in pieces:
            self.on_body(piece)
        if body.done:
            self._declined = None
            self.on_message_complete()
            if rest:  # a next request on the connection
                self.data_received(rest)

    def _arm_read_timer(self) -> None:
        """Time what is being read (``_reading``) from when it began."""
        if (self.read_timeout_s is not None and self._reading is not None
                and not self.transport.is_closing()):
            since, scope = self._reading
            self._read_timer = self.loop.call_at(since + self.read_timeout_s,
                                                 self._read_timed_out, scope)

    def _stalled(self) -> None:
        """The client took none of its answer for ``read_timeout_s`` or 5 s (app/flow.py)."""
        self.logger.warning(STALLED)
        reset(self.transport)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self, scope: Any) -> None:
        """The request has not arrived whole in time: answer 408 unless the app already
        answered, and close (the app, if it is reading the body, sees the client gone)."""
        self._read_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if scope and (cycle is None or cycle.scope is not scope):  # a request the app never
            self._counted(408, "request_timeout")  # saw (one it did, it counts)
        self._cut_off(scope, 408, "Request Timeout", "request_timeout",
                      f"the request did not arrive within {self.read_timeout_s:g} s")

    def _cut_off(self, scope: Any, status: int, reason: str, kind: str, message: str) -> None:
        """Answer ``status`` for the request of ``scope`` unless the app has begun its answer,
        and close; the app, if it is reading the body, sees the client gone and counts it."""
        scope[CUT_OFF] = (status, kind)
        cycle = self.cycle
        if cycle is None or cycle.scope is not scope or not cycle.response_started:
            self._refuse(status, reason, kind, message, str(scope.get("path", "")))
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """The 400 for bytes that are no HTTP/1.1 request, ``msg`` saying what the parser found
        wrong (``Invalid header value char``), counted; in the error format of the path, where
        one was read, as the other refusals here (uvicorn's is a line of plain text)."""
        self._counted(400, "invalid_http")
        self._cancel_read_timer()
        self._refuse(400, "Bad Request", "invalid_http", f"the request is not valid HTTP/1.1: "
                     f"{msg}", getattr(self, "url", b"").decode("latin-1"))

    def _counted(self, status: int, kind: str) -> None:
        """Count an answer the protocol gives itself, before any route (``count_refusal``)."""
        count = self.count_refusal
        if count is not None:
            now = self.loop.time()
            count(status, kind, now - self._reading[0] if self._reading is not None else 0.0)

    def _refuse(self, status: int, reason: str, kind: str, message: str, path: str) -> None:
        """Answer ``status`` in the error format of the route ``path`` names, and close."""
        self.transport.write(refusal(status, reason, kind, message, path))
        self.transport.close()


class Refused(Exception):
    """A request's head is refused: over ``MAX_HEAD_BYTES``, or a transfer coding not served
    (raised inside the parser's callback)."""
