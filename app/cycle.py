"""uvicorn's request-response cycle, each answer in one write and its head made at less cost.

uvicorn writes the status line and headers when the app sends ``http.response.start`` and the
body at ``http.response.body``: two ``write`` calls, so two TCP segments and two wake-ups of the
client for every answer. ``Cycle`` holds the head until the body comes, and both go out in one
``writelines`` (one ``writev`` on uvloop, the body not copied); a head with nothing written after
it (HEAD, an empty body) goes when the response completes or the cycle closes the connection.
What it writes once its connection is closing is dropped: its client is gone, or the connection
was closed under it (a 400 for a request pipelined after it, a 408), and a write to the closed
socket would raise.

uvicorn's ``send`` also checks every header of every answer, its own ``date`` and ``server``
among them, with two regular-expression searches, a lower-casing and three comparisons each.
``Cycle`` makes the same head and refuses the same headers, but checks and formats uvicorn's
default headers once for each list of them (uvicorn makes a new one each second, for its date),
and a header name once (``header_name``: a table of the last few hundred names; an answer's are
a handful); each value is still searched. A front end's instructions a request (``python -m
bench.instructions``, mlp): 0.976 x at 32 connections for the head, 0.981 x more for the head
held here rather than in a transport of its own. The protocol (app/connection.py) builds its
cycles of this class; its ``send`` and ``run_asgi`` hold uvicorn's code (0.54), not a call to
it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

Headers = Iterable[tuple[bytes, bytes]]

# The names whose value changes how the answer is framed, lower-cased, and their kind.
CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION = 1, 2, 3
FRAMING = {b"content-length": CONTENT_LENGTH, b"transfer-encoding": TRANSFER_ENCODING,
           b"connection": CONNECTION}


@functools.lru_cache(maxsize=256)
def header_name(name: bytes) -> tuple[bytes, int]:
    """``name`` lower-cased as the head writes it, and its kind (``FRAMING``; 0 for any
    other); RuntimeError where uvicorn refuses it."""
    if HEADER_RE.search(name):
        raise RuntimeError("Invalid HTTP header name.")
    lowered = name.lower()
    return lowered, FRAMING.get(bytes(lowered), 0)  # bytes: a bytearray is no key


def plain_lines(headers: Headers) -> bytes | None:
    """``headers``' lines in the head, where none of them changes the answer's framing and
    uvicorn takes each; else None (``Cycle`` then takes them one by one, as uvicorn does)."""
    lines: list[bytes] = []
    for name, value in headers:
        lowered, kind = header_name(name)
        if kind or HEADER_VALUE_RE.search(value):
            return None
        lines += (lowered, b": ", value, b"\r\n")
    return b"".join(lines)


# The last default headers a cycle sent and their lines (one tuple, read and replaced whole:
# each server's loop thread may replace it).
_defaults: tuple[object, bytes | None] = (None, None)


class Cycle(RequestResponseCycle):
    """uvicorn's cycle, each answer in one write and its head made at less cost (the module's
    docstring says how)."""

    _held: bytes | None = None  # the answer's head, till the body's first write

    async def run_asgi(self, app: Any) -> None:
        """uvicorn's, a held head written before the connection is closed."""
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self._close()
        else:
            if result is not None:
                self.logger.error("ASGI callable should return None, but returned '%s'.", result)
                self._close()
            elif not self.response_started and not self.disconnected:
                self.logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                self.logger.error("ASGI callable returned without completing response.")
                self._close()
        finally:
            self.on_response = lambda: None

    async def send(self, message: Any) -> None:
        """uvicorn's, the head made by ``_head`` and held for the body's write. An answer given
        before the body its client waits to send (``Expect: 100-continue``, no ``100
        Continue`` sent) closes the connection and says so (RFC 9110, 10.1.1): the client sends
        no body, and a connection read on would take its next request for that body."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            if self.waiting_for_100_continue and self.more_body:
                self.keep_alive = False
            self.response_started = True
            self.waiting_for_100_continue = False
            status_code = message["status"]
            if self.access_log:
                self.access_logger.info(
                    '%s - "%s %s HTTP/%s" %d', get_client_addr(self.scope),
                    self.scope["method"], get_path_with_query_string(self.scope),
                    self.scope["http_version"], status_code)
            self._held = self._head(status_code, message.get("headers", ()))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
            body = message.get("body", b"")
            more_body = message.get("more_body", False)
            if self.scope["method"] == "HEAD":
                self.expected_content_length = 0
            elif self.chunked_encoding:
                content = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
                if not more_body:
                    content.append(b"0\r\n\r\n")
                self._write(b"".join(content))
            else:
                num_bytes = len(body)
                if num_bytes > self.expected_content_length:
                    raise RuntimeError("Response content longer than Content-Length")
                self.expected_content_length -= num_bytes
                self._write(body)
            if not more_body:
                if self.expected_content_length != 0:
                    raise RuntimeError("Response content shorter than Content-Length")
                self.response_complete = True
                self.message_event.set()
                if not self.keep_alive:
                    self._close()
                elif self._held is not None:
                    self._write(b"")
                self.on_response()
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, after response already "
                "completed.")

    def _head(self, status_code: int, headers: Headers) -> bytes:
        """The status line and headers uvicorn's ``send`` writes, its framing state set as it
        sets it."""
        global _defaults
        defaults = self.default_headers
        made = _defaults
        if made[0] is not defaults:
            made = _defaults = (defaults, plain_lines(defaults))
        lines = made[1]
        content = [STATUS_LINE[status_code]]
        if lines is None:
            headers = [*defaults, *headers]
        else:
            content.append(lines)
        has_connection_close = False
        for name, value in headers:
            try:
                lowered, kind = header_name(name)
            except TypeError:  # a name that cannot be a key (a bytearray): checked uncached
                lowered, kind = header_name.__wrapped__(name)
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            if not kind:  # most headers: nothing of the framing to set
                pass
            elif kind == CONTENT_LENGTH and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif kind == TRANSFER_ENCODING and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif kind == CONNECTION and b"close" in [
                    token.lower().strip() for token in value.split(b",")]:
                self.keep_alive = False
                has_connection_close = True
            content += (lowered, b": ", value, b"\r\n")
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if (self.chunked_encoding is None and self.scope["method"] != "HEAD"
                and status_code not in (204, 304)):
            self.chunked_encoding = True  # neither a length nor a transfer coding given
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _write(self, data: bytes) -> None:
        """``data``, after the head where it is held, in one write."""
        head, self._held = self._held, None
        transport = self.transport
        if transport.is_closing():
            return
        if head is None:
            transport.write(data)
        else:
            transport.writelines([head, data])  # uvloop: one writev, the body not copied

    def _close(self) -> None:
        if self._held is not None:
            self._write(b"")
        self.transport.close()
