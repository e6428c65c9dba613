"""uvicorn's request-response cycle with an answer's head made at less cost.

uvicorn's ``send`` checks every header of every answer, its own ``date`` and ``server`` among
them, with two regular-expression searches, a lower-casing and three comparisons each: about
1 % of a front end's instructions a request (docs/frontends.md). ``Cycle`` makes the same head
and refuses the same headers, but checks and formats uvicorn's default headers once for each
list of them (uvicorn makes a new one each second, for its date), and a header name once
(``header_name``: a table of the last few hundred names; an answer's are a handful); each value
is still searched. The protocol (app/connection.py) builds its cycles of this class.
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
    return lowered, FRAMING.get(lowered, 0)


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
    async def send(self, message: Any) -> None:
        """uvicorn's (0.54: its body here, not called), the head made by ``_head``."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            self.response_started = True
            self.waiting_for_100_continue = False
            status_code = message["status"]
            if self.access_log:
                self.access_logger.info(
                    '%s - "%s %s HTTP/%s" %d', get_client_addr(self.scope),
                    self.scope["method"], get_path_with_query_string(self.scope),
                    self.scope["http_version"], status_code)
            self.transport.write(self._head(status_code, message.get("headers", ())))
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
                self.transport.write(b"".join(content))
            else:
                num_bytes = len(body)
                if num_bytes > self.expected_content_length:
                    raise RuntimeError("Response content longer than Content-Length")
                self.expected_content_length -= num_bytes
                self.transport.write(body)
            if not more_body:
                if self.expected_content_length != 0:
                    raise RuntimeError("Response content shorter than Content-Length")
                self.response_complete = True
                self.message_event.set()
                if not self.keep_alive:
                    self.transport.close()
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
            lowered, kind = header_name(name)
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
