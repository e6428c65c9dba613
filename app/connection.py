"""uvicorn's httptools protocol as batchserve serves HTTP with it: each answer in one write
(``Cycle``, app/cycle.py), and bounds a slow, large or pipelining client cannot pass.

A request must arrive within ``read_timeout_s`` (408), its line and headers, and a chunked
body's trailers, within ``MAX_HEAD_BYTES`` (431), in no transfer coding but chunked (501); a
connection's reads pause past ``PIPELINE_LIMIT`` waiting requests, and one whose client takes
none of its answer for ``read_timeout_s`` (5 s at least) is reset (app/flow.py). What the
protocol answers itself, before any route saw the request (those, a 503 past
``max_connections``, a 400 for bytes that are not HTTP), is counted by ``count_refusal``.
``batchserve serve`` passes ``protocol_for``'s class to uvicorn as its ``http``
implementation; ``uvicorn --factory app.main:create_app`` runs with uvicorn's own.

The callbacks every request passes through (``on_message_begin``, ``on_body``,
``on_message_complete``, ``on_headers_complete``'s end and ``_start_asgi_task``) hold uvicorn's
code (0.54; pyproject.toml pins the versions tested) with batchserve's, not a ``super()`` call to
it: a front end's instructions a request 0.974 x at 32 connections (``python -m
bench.instructions``), the protocol's own 0.935 x (``python -m bench.protocols``). The answers
the protocol gives itself, its rare paths, are app/bounded.py's.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.bounded import MAX_HEAD_BYTES, BoundedProtocol, Refused
from app.cycle import Cycle
from app.errors import quoted
from app.facade import Refusals
from app.flow import ConnectionFlow
from app.framing import FramingError, body_of, head_size, unknown_coding
from app.logs import INVALID_HTTP
from app.refused import over_connections, parser_said
from app.values import SLOW_LINK_S

log = logging.getLogger("batchserve")


# How long a connection between requests is still read once the server shuts down: a request
# waiting in its socket, or sent meanwhile by a client in mid-exchange, is answered, not reset.
# The exit waits that long more where a connection is idle.
LAST_READ_S = 0.25


class OneWriteProtocol(BoundedProtocol):
    """uvicorn's httptools protocol with a ``Cycle`` for every request and the bounds the
    module names (``protocol_for`` sets the time bound), which a slow or hostile client cannot
    pass to hold the server's connections or memory. A request that asks to upgrade (h2c) is
    answered in HTTP/1.1 with its body, as RFC 9110 lets a server do. At shutdown a connection
    between requests is read a moment more before it closes (``shutdown``)."""

    stall_s: float | None = None  # read_timeout_s, SLOW_LINK_S at least (app/flow.py)
    _in_head = True  # what arrives now is a request's line and headers
    _head_bytes = 0  # received since the last request's headers were whole
    # Bytes of the reads, since a chunk's header, that held none of the body: the last chunk's
    # trailers, which httptools gathers whole before it hands them on (None: no chunk header
    # waits for its data). ``_bodied``: the read being parsed held some of the body.
    _trailing: int | None = None
    _bodied = False
    _last = False  # the connection closes after the request under way, or the next one
    # The cycle whose app runs; ``cycle`` is the last request parsed, a pipelined one that
    # waits behind it when the client pipelines.
    _running: RequestResponseCycle | None = None

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
        if self.timeout_keep_alive_task is not None:  # uvicorn's data_received from here
            self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self.transport.is_closing():  # else refused in a callback (on_headers_...)
                self.logger.warning(INVALID_HTTP)
                self.send_400_response(parser_said(exc))
        except httptools.HttpParserUpgrade as upgrade:
            self._upgrade(data, upgrade)
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
        """uvicorn's (its body here, not called)."""
        self._trailing, self._bodied = None, True
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        cycle.body += body
        if len(cycle.body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_begin(self) -> None:
        """uvicorn's (its body here, not called: a call a request less), the read timer off."""
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }
        if self._read_timer is not None:
            self._cancel_read_timer()
        self._reading = (self.loop.time(), self.scope)

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
                         f"Transfer-Encoding {quoted(coding)} is not one this server "
                         "takes: chunked only (gzip and deflate go in Content-Encoding)",
                         self.url.decode("latin-1"))
            raise Refused
        self._in_head, self._head_bytes = False, 0
        upgrade = self.parser.should_upgrade()
        if upgrade and self._should_upgrade():  # a WebSocket, where uvicorn serves them: no
            super().on_headers_complete()  # cycle, the connection goes to its protocol
            return
        self._begin()
        if upgrade:
            try:
                self._declined = body_of(self.headers)
            except FramingError:
                self._declined = None  # llhttp refuses the length itself

    def _begin(self) -> None:
        """uvicorn's ``on_headers_complete`` past its upgrade (its body here, not called), its
        cycle a ``Cycle``."""
        parser, scope = self.parser, self.scope
        http_version = parser.get_http_version()
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        parsed_url = httptools.parse_url(self.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = parsed_url.query or b""
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        else:
            app = self.app
        existing = self.cycle
        cycle = self.cycle = Cycle(
            scope=scope, transport=self.transport, flow=self.flow, logger=self.logger,
            access_logger=self.access_logger, access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            # An HTTP/1.0 client knows no 1xx answer and would take one for its answer: its
            # expectation is ignored (RFC 9110, 10.1.1), where uvicorn would send one.
            expect_100_continue=self.expect_100_continue and http_version != "1.0",
            keep_alive=http_version != "1.0" and parser.should_keep_alive() and not self._last,
            on_response=self.on_response_complete)
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, app)
        else:  # pipelined: it waits
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))

    def on_message_complete(self) -> None:
        if self._declined is not None:  # llhttp ends a request that asks to upgrade here: its
            return  # body, read by _read_declined, is still to come
        if self._read_timer is not None:
            self._cancel_read_timer()
        self._reading = None
        self._trailing = None
        self._in_head = True  # a next request's head may follow
        cycle = self.cycle  # uvicorn's on_message_complete (its body here, not called)
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        cycle.more_body = False
        cycle.message_event.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        # uvicorn cancels its keep-alive timer on a clean close only: after a reset the timer
        # would hold this protocol and its last request for keep_alive_s.
        self._unset_keepalive_if_required()
        # uvicorn tells only the last request parsed that its client has gone: where a
        # pipelined one waits, the running one would be computed and counted answered for no
        # one, its disconnect watch (app/api/inference.py) never woken.
        running = self._running
        if running is not None and running is not self.cycle and not running.response_complete:
            running.disconnected = True
            running.message_event.set()
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

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """uvicorn's (without its opt-in ``reset_contextvars``, which batchserve leaves off),
        but a request past ``limit_concurrency``, which uvicorn gives its 503 app, is counted
        and answered by ``over_connections``."""
        if app is service_unavailable:
            self._counted(503, "connections")
            app = over_connections
        self._running = cycle
        task = self.loop.create_task(cycle.run_asgi(app))  # uvicorn's (not called)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)


def protocol_for(read_timeout_s: float, count_refusal: Refusals | None = None
                 ) -> type[OneWriteProtocol]:
    """``OneWriteProtocol`` cutting off requests that take longer than ``read_timeout_s`` to
    arrive, and counting what it answers itself with ``count_refusal``."""
    return type("OneWriteProtocol", (OneWriteProtocol,), {
        "read_timeout_s": read_timeout_s, "stall_s": max(read_timeout_s, SLOW_LINK_S),
        "count_refusal": staticmethod(count_refusal)
        if count_refusal is not None else None})
