"""Reading request bodies from ASGI, with the size limit enforced before the body is whole, and
inflating the ones sent compressed."""

from __future__ import annotations

import zlib

from starlette.types import Receive

from app.arriving import Arriving
from app.errors import InvalidInput, PayloadTooLarge, UnsupportedEncoding, quoted
from app.framing import decimal

# The Content-Encodings Triton takes (tritonclient's request_compression_algorithm sends them),
# as zlib's window bits: gzip's header, or deflate's zlib one.
_GZIP = 16 + zlib.MAX_WBITS
ENCODINGS = {b"gzip": _GZIP, b"x-gzip": _GZIP, b"deflate": zlib.MAX_WBITS}
MAX_MEMBERS = 1000  # of a gzip body: each costs a new inflater (16 MB of empty ones: 800,000)
_WINDOW = 64 * 1024  # of compressed bytes an inflater is given at a time


CLIENT_CLOSED = 499  # nginx's convention; never reaches the (gone) client, only metrics


# A body declared longer than this takes its room in ``arriving`` before any of it is read:
# uvicorn hands a body over once it holds 64 KiB of it, so a longer one seldom comes whole, and
# a client that sent ``Expect: 100-continue`` is refused before it sends the body.
LIKELY_WHOLE = 64 * 2**10


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def read_body(receive: Receive, limit: int, declared: bytes | None = None,
                    arriving: Arriving | None = None) -> bytes:
    """The body, or PayloadTooLarge as soon as it is known to exceed ``limit`` bytes.

    ``declared`` is the Content-Length header, if any. A body that comes in pieces, or is
    declared past ``LIKELY_WHOLE``, takes its room in ``arriving`` till it is whole
    (app/arriving.py: 503 busy where there is none).
    ClientGone if the client disconnects.
    """
    length = decimal(declared or b"") or 0  # llhttp checked it
    if length > limit:
        raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = taken = 0
    try:
        if arriving is not None and length > LIKELY_WHOLE:  # before a 100 Continue asks for it
            arriving.take(length)
            taken = length
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientGone
            chunk: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            if not chunks and not more and len(chunk) <= limit:
                return chunk  # the usual case: the whole body in one message
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
            if arriving is not None and size > taken:  # its whole length at once where declared
                wanted = max(size, length)
                arriving.take(wanted - taken)
                taken = wanted
            chunks.append(chunk)
            if not more:
                return b"".join(chunks)
    finally:
        if arriving is not None and taken:
            arriving.give_back(taken)


async def read_inflated(receive: Receive, limit: int, declared: bytes | None,
                        encoding: bytes | None, arriving: Arriving | None = None) -> bytes:
    """A request's body read (``read_body``) and inflated from its ``encoding`` (``inflated``),
    within ``limit`` both ways."""
    return inflated(await read_body(receive, limit, declared, arriving), encoding, limit)


def inflated(body: bytes, encoding: bytes | None, limit: int) -> bytes:
    """``body`` as it was before its ``Content-Encoding`` (gzip or deflate), at most ``limit``
    bytes once inflated: a small body cannot become a large one (PayloadTooLarge past it).
    UnsupportedEncoding (415) for another encoding; InvalidInput for bytes that are not one.
    A gzip body may be several members, one after another (RFC 1952: what ``cat a.gz b.gz``
    writes): all of them, in order, MAX_MEMBERS at most."""
    name = (encoding or b"").strip().lower()
    if name in (b"", b"identity"):
        return body
    wbits = ENCODINGS.get(name)
    if wbits is None:
        raise UnsupportedEncoding(f"Content-Encoding {quoted(name)} is not one this "
                                  "server takes: gzip, deflate or none")
    parts: list[bytes] = []
    view, start, size = memoryview(body), 0, 0
    for _ in range(MAX_MEMBERS):
        start, size = _member(view, start, size, name, wbits, parts, limit)
        if start == len(view):
            return b"".join(parts)
        if wbits != _GZIP:
            raise InvalidInput(f"request body has {len(view) - start} bytes after its "
                               f"{name.decode()} data")
    raise InvalidInput(f"request body is more than {MAX_MEMBERS} gzip members")


def _member(view: memoryview, start: int, size: int, name: bytes, wbits: int,
            parts: list[bytes], limit: int) -> tuple[int, int]:
    """Inflate the member that begins at ``start`` onto ``parts`` (``size`` bytes so far, all
    within ``limit``); where the next begins, and the size then. Fed a window at a time, so
    that what follows a member is copied (``unused_data``) a window at most, not the whole
    rest of the body."""
    inflater = zlib.decompressobj(wbits)
    pos = start
    while not inflater.eof:
        if pos == len(view):
            raise InvalidInput(f"request body ends before its {name.decode()} data does")
        window = view[pos:pos + _WINDOW]
        pos += len(window)
        try:
            part = inflater.decompress(window, limit + 1 - size)
        except zlib.error as exc:
            raise InvalidInput(f"request body is not {name.decode()} data: {exc}") from None
        parts.append(part)
        size += len(part)
        if size > limit:  # also where the output stopped at its bound, input left over
            raise PayloadTooLarge(f"request body inflates to more than the limit of {limit} bytes")
    return pos - len(inflater.unused_data), size
