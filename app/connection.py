"""uvicorn's httptools protocol as batchserve serves HTTP with it: each answer in one write
(``HeadHeld``, app/head_held.py), and bounds a slow, large or pipelining client cannot pass.

A request must arrive within ``read_timeout_s`` (408), its line and headers, and a chunked
body's trailers, within ``MAX_HEAD_BYTES`` (431), in no transfer coding but chunked (501); a
connection's reads pause past ``PIPELINE_LIMIT`` waiting requests, and one whose client takes
none of its answer for ``read_timeout_s`` (5 s at least) is reset (app/flow.py). What the
protocol answers itself, before any route saw the request (those, a 503 past
``max_connections``, a 400 for bytes that are not HTTP), is counted by ``count_refusal``.
``batchserve serve`` passes ``protocol_for``'s class to uvicorn as its ``http``
implementation; ``uvicorn --factory app.main:create_app`` runs with uvicorn's own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from app.api.inference import CUT_OFF
from app.facade import Refusals
from app.flow import ConnectionFlow, reset
from app.framing import Body, FramingError, body_of, head_size, unknown_coding
from app.head_held import HeadHeld
from app.logs import INVALID_HTTP, STALLED
from app.refused import over_connections, parser_said, refusal
from app.values import SLOW_LINK_S

log = logging.getLogger("batchserve")


# The most bytes a request line and its headers may take (uvicorn sets no bound: a client could
# make the server hold gigabytes of one header). Past Node's 16 KiB and nginx's 32 KiB.
MAX_HEAD_BYTES = 64 * 1024
# How long a connection between requests is still read once the server shuts down: a request
# waiting in its socket, or sent meanwhile by a client in mid-exchange, is answered, not reset.
# The exit waits that long more where a connection is idle.
LAST_READ_S = 0.25


class OneWriteProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``HeadHeld`` for every request and the bounds the
    module names (``protocol_for`` sets the time bound), which a slow or hostile client cannot
    pass to hold the server's connections or memory. A request that asks to upgrade (h2c) is
    answered in HTTP/1.1 with its body, as RFC 9110 lets a server do. At shutdown a connection
    between requests is read a moment more before it closes (``shutdown``)."""

    read_timeout_s: float | None = None
    stall_s: float | None = None  # read_timeout_s, SLOW_LINK_S at least (app/flow.py)
    count_refusal: Refusals | None = None
    _read_timer: asyncio.TimerHandle | None = None
    # What is being read and since when (the loop's time): the connection till its first
    # request begins ({}), then each request's scope till it is whole; None between requests
    # (uvicorn's keep-alive timer bounds those).
    _reading: tuple[float, Any] | None = None
    _in_head = True  # what arrives now is a request's line and headers
    _head_bytes = 0  # received since the last request's headers were whole
    # The body of a request whose Upgrade (h2c) is declined, read here (app/framing.py).
    _declined: Body | None = None
    # Bytes of the reads, since a chunk's header, that held none of the body: the last chunk's
    # trailers, which httptools gathers whole before it hands them on (None: no chunk header
    # waits for its data). ``_bodied``: the read being parsed held some of the body.
    _trailing: int | None = None
    _bodied = False
    _last = False  # the connection closes after the request under way, or the next one

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.flow = ConnectionFlow(transport, self.pipeline, self.stall_s, self._stalled)
        self._reading = (self.loop.time(), {})
        self._arm_read_timer()  # a connection that never sends a request is cut off too

    def data_received(self, data: bytes) -> None:
        """Reads ``data``; a request still incomplete after it gets its read timer now, not at
        its start: most arrive whole in one read and never need one."""
        if self._declined is not None:  # a declined upgrade's body, after its headers
            self._read_declined(data)
        else:
            self._read(data)
        if self._read_timer is None and self._reading is not None:
            self._arm_read_timer()

    def _read(self, data: bytes) -> None:
        counted = self._in_head
        if counted:
            self._head_bytes += len(data)
        self._bodied = False
        self._feed(data)
        if (counted and self._in_head and self._head_bytes > MAX_HEAD_BYTES
                and not self.transport.is_closing()):  # not after uvicorn's own 400
            self._refuse_head()
        elif self._trailing is not None and not self._bodied:
            self._trailing += len(data)  # the read that began them (with body) goes uncounted
            if self._trailing > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._trailing = None
                self._cut_off(self.scope, 431, "Request Header Fields Too Large",
                              "headers_too_large",
                              f"the request's trailers are over {MAX_HEAD_BYTES} bytes")

    def on_chunk_header(self) -> None:
        self._trailing = 0

    def on_body(self, body: bytes) -> None:
        self._trailing, self._bodied = None, True
        super().on_body(body)

    def _refuse_head(self) -> None:
        self._counted(431, "headers_too_large")
        self._cancel_read_timer()
        self._refuse(431, "Request Header Fields Too Large", "headers_too_large",
                     f"the request's line and headers are over {MAX_HEAD_BYTES} bytes",
                     getattr(self, "url", b"").decode("latin-1"))  # the path as it came

    def _feed(self, data: bytes) -> None:
        """uvicorn's ``data_received``, reading the body of a request whose Upgrade it declines
        (it dropped it: an h2c POST reached the app with an empty body)."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.transport.is_closing():  # refused in a callback (on_headers_complete)
                return
            self.logger.warning(INVALID_HTTP)
            self.send_400_response(parser_said(exc))
        except httptools.HttpParserUpgrade as upgrade:
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

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._cancel_read_timer()
        self._reading = (self.loop.time(), self.scope)

    def _arm_read_timer(self) -> None:
        """Time what is being read (``_reading``) from when it began."""
        if (self.read_timeout_s is not None and self._reading is not None
                and not self.transport.is_closing()):
            since, scope = self._reading
            self._read_timer = self.loop.call_at(since + self.read_timeout_s,
                                                 self._read_timed_out, scope)

    def on_headers_complete(self) -> None:
        # A head that ends in the read that took the count past the bound: that read may hold
        # a body or further requests too, so the head's own size decides.
        if (self._head_bytes > MAX_HEAD_BYTES
                and head_size(self.url, self.headers) > MAX_HEAD_BYTES):
            self._refuse_head()
            raise Refused  # stops the parser: nothing of this request reaches the app
        coding = unknown_coding(self.headers)
        if coding is not None:  # RFC 9112, 6.1: a coding the server does not know is a 501
            self._counted(501, "transfer_coding")
            self._refuse(501, "Not Implemented", "unsupported_encoding",
                         f"Transfer-Encoding {coding.decode('latin-1')!r} is not one this server "
                         "takes: chunked only (gzip and deflate go in Content-Encoding)",
                         self.url.decode("latin-1"))
            raise Refused
        self._in_head, self._head_bytes = False, 0
        upgrade = self.parser.should_upgrade()
        if upgrade and self._should_upgrade():  # a WebSocket, where uvicorn serves them: no
            super().on_headers_complete()  # cycle, the connection goes to its protocol
            return
        super().on_headers_complete()
        cycle = self.cycle
        if self._last:
            cycle.keep_alive = False
        held = cycle.transport = HeadHeld(self.transport, cycle)  # type: ignore[assignment]
        cycle.on_response = held.done
        if upgrade:
            try:
                self._declined = body_of(self.headers)
            except FramingError:
                self._declined = None  # llhttp refuses the length itself

    def on_message_complete(self) -> None:
        if self._declined is not None:  # llhttp ends a request that asks to upgrade here: its
            return  # body, read by _read_declined, is still to come
        self._cancel_read_timer()
        self._reading = None
        self._trailing = None
        self._in_head = True  # a next request's head may follow
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        # uvicorn cancels its keep-alive timer on a clean close only: after a reset the timer
        # would hold this protocol and its last request for keep_alive_s.
        self._unset_keepalive_if_required()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """uvicorn closes a connection between requests at once, resetting a request its client
        has sent by then: here the connection is read ``LAST_READ_S`` more, such a request
        answered (503 ``draining``) with ``Connection: close`` as one under way is, then closed."""
        self._last = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False
        else:
            self.loop.call_later(LAST_READ_S, super().shutdown)

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

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """uvicorn starts a request here, with its 503 app past ``limit_concurrency``: that
        request is counted and answered by ``over_connections`` instead."""
        if app is service_unavailable:
            self._counted(503, "connections")
            app = over_connections
        super()._start_asgi_task(cycle, app)

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


def protocol_for(read_timeout_s: float, count_refusal: Refusals | None = None
                 ) -> type[OneWriteProtocol]:
    """``OneWriteProtocol`` cutting off requests that take longer than ``read_timeout_s`` to
    arrive, and counting what it answers itself with ``count_refusal``."""
    return type("OneWriteProtocol", (OneWriteProtocol,), {
        "read_timeout_s": read_timeout_s, "stall_s": max(read_timeout_s, SLOW_LINK_S),
        "count_refusal": staticmethod(count_refusal)
        if count_refusal is not None else None})
