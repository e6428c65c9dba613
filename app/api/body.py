"""Reading request bodies from ASGI, with the size limit enforced before the body is whole, and
inflating the ones sent compressed."""

from __future__ import annotations

import zlib

from starlette.types import Receive

from app.arriving import Arriving
from app.errors import InvalidInput, PayloadTooLarge, UnsupportedEncoding
from app.framing import decimal

# The Content-Encodings Triton takes (tritonclient's request_compression_algorithm sends them),
# as zlib's window bits: gzip's header, or deflate's zlib one.
ENCODINGS = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS,
             b"deflate": zlib.MAX_WBITS}


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


def inflated(body: bytes, encoding: bytes | None, limit: int) -> bytes:
    """``body`` as it was before its ``Content-Encoding`` (gzip or deflate), at most ``limit``
    bytes once inflated: a small body cannot become a large one (PayloadTooLarge past it).
    UnsupportedEncoding (415) for another encoding; InvalidInput for bytes that are not one."""
    name = (encoding or b"").strip().lower()
    if name in (b"", b"identity"):
        return body
    wbits = ENCODINGS.get(name)
    if wbits is None:
        raise UnsupportedEncoding(f"Content-Encoding {name.decode('latin-1')!r} is not one this "
                                  "server takes: gzip, deflate or none")
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"request body is not {name.decode()} data: {exc}") from None
    if len(out) > limit:
        raise PayloadTooLarge(f"request body inflates to more than the limit of {limit} bytes")
    if not inflater.eof:
        raise InvalidInput(f"request body ends before its {name.decode()} data does")
    return out
