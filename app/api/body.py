"""Reading request bodies from ASGI, with the size limit enforced before the body is whole."""

from __future__ import annotations

from starlette.types import Receive

from app.errors import PayloadTooLarge


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def read_body(receive: Receive, limit: int, declared: bytes | None = None) -> bytes:
    """The body, or PayloadTooLarge as soon as it is known to exceed ``limit`` bytes.

    ``declared`` is the Content-Length header, if any. ClientGone if the client disconnects.
    """
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
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
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)
