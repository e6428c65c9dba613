"""An HTTP/1.1 request body's framing (``Content-Length`` or chunked), read from raw bytes, and
the numbers a request states (``decimal``) and its head's size (``head_size``).

llhttp (through httptools) ends a request that asks to ``Upgrade`` (``Upgrade: h2c``, sent by
``curl --http2`` and by Spring's RestClient) at its headers, since what follows would be another
protocol. A server that declines the upgrade must read the body as HTTP/1.1 (RFC 9110, 7.8), so
app/connection.py reads it with this. Pure: bytes in, body pieces out.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_LINE = 4096  # a chunk-size line or a trailer line longer than this is refused
MOST_DIGITS = 18  # of a number a request states (a length, a level): int64's, and below the
# 4,300 past which int() raises instead of reading it


def decimal(text: bytes | str) -> int | None:
    """The whole number ``text`` writes in ASCII digits ("²" and "٣" are digits to
    ``isdigit``), at most ``MOST_DIGITS`` of them; None for anything else."""
    if not (text.isascii() and text.isdigit()) or len(text) > MOST_DIGITS:
        return None
    return int(text)


class FramingError(ValueError):
    """The bytes are not a body of the framing its headers announced."""


class Body:
    """Reads one body: ``feed`` gives (the body's bytes in it, whether the body is complete,
    the bytes past its end)."""

    def __init__(self, length: int | None) -> None:
        """``length``: the ``Content-Length``; None: chunked."""
        self._left = 0 if length is None else length  # bytes left in the body, or in a chunk
        self._state = "size" if length is None else "data"
        self._chunked = length is None
        self._line = b""  # a line read in part: a chunk's size, or a trailer
        self.done = length == 0

    def feed(self, data: bytes) -> tuple[list[bytes], bytes]:
        """The body's pieces in ``data`` and, once ``done``, the bytes after it. Raises
        FramingError."""
        pieces: list[bytes] = []
        at = 0
        while at < len(data) and not self.done:
            if self._state == "data":
                piece = data[at:at + self._left]
                pieces.append(piece)
                self._left -= len(piece)
                at += len(piece)
                if not self._left:
                    self._state = "crlf" if self._chunked else "end"
                    self.done = not self._chunked
            else:
                end = data.find(b"\n", at)
                line = self._line + data[at:len(data) if end < 0 else end + 1]
                if len(line) > MAX_LINE:
                    raise FramingError("a chunk line is too long")
                if end < 0:
                    self._line = line
                    break
                self._line = b""
                at = end + 1
                self._line_read(line.rstrip(b"\r\n"))
        return pieces, data[at:] if self.done else b""

    def _line_read(self, line: bytes) -> None:
        if self._state == "crlf":  # after a chunk's data
            if line:
                raise FramingError("a chunk's data is longer than its size")
            self._state = "size"
        elif self._state == "size":
            size = line.split(b";", 1)[0].strip()
            if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                raise FramingError(f"a chunk size is not hexadecimal: {size[:20]!r}")
            self._left = int(size, 16)
            self._state = "data" if self._left else "trailer"
        elif not line:  # the empty line after the trailers
            self.done = True


def body_of(headers: Sequence[tuple[bytes, bytes]]) -> Body | None:
    """The body its headers (lower-case names) announce; None when there is none. Raises
    FramingError for a length that is not one."""
    length = None
    for name, value in headers:
        if name == b"transfer-encoding" and value.strip().lower().endswith(b"chunked"):
            return Body(None)
        if name == b"content-length":
            length = decimal(value.strip())
            if length is None:
                raise FramingError(f"Content-Length is not a length: {value[:20]!r}")
    return Body(length) if length else None


def unknown_coding(headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    """A transfer coding other than chunked that a request's ``Transfer-Encoding`` names
    (lower-case header names); None where there is none. llhttp takes any codings before a
    final ``chunked`` and hands the body on still in them, to be read as if it were plain."""
    for name, value in headers:
        if name == b"transfer-encoding":
            for coding in value.split(b","):
                coding = coding.strip().lower()
                if coding != b"chunked":
                    return coding
    return None


def head_size(url: bytes, headers: Sequence[tuple[bytes, bytes]]) -> int:
    """About the bytes of a request's head: its target and headers, with their separators
    (the method and version lines' few bytes left out)."""
    return len(url) + sum(len(name) + len(value) + 4 for name, value in headers)
