"""A request a front end relays over its link to the device process's own app (everything that
is not inference: health, metrics, metadata, the repository, docs), and the answer that comes
back (docs/frontends.md).

An ``Asked`` is the part of the front end's ASGI scope the app reads, and the whole body; the
device process runs its app on it in-process (``answer``): no HTTP server, client or parse on
either side (an HTTP hop costs a front end about nine times the CPU, docs/frontends.md). The
path travels as the client sent it, decoded and raw, so the app sees what a single process's
app would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from starlette.types import ASGIApp, Message, Scope

log = logging.getLogger("batchserve.asks")

Headers = list[tuple[bytes, bytes]]


class Asked(NamedTuple):
    method: str
    path: str
    raw_path: bytes | None
    query_string: bytes
    headers: Headers  # as the app is to see them (the front end's hop-by-hop ones dropped)
    client: tuple[str, int] | None
    body: bytes


class Replied(NamedTuple):
    status: int
    headers: Headers
    body: bytes


Ask = Callable[[Asked], Awaitable[Replied]]  # the app's answer to a request, however reached


def asked(scope: Scope, headers: Headers, body: bytes) -> Asked:
    """What a front end sends for the request of ``scope``, with ``headers`` and ``body``."""
    client = scope.get("client")
    return Asked(scope["method"], scope["path"], scope.get("raw_path"),
                 scope.get("query_string", b""), headers,
                 tuple(client) if client else None, body)


async def answer(app: ASGIApp, request: Asked) -> Replied:
    """``app``'s whole answer to ``request``, called as a server would call it. A failure of
    the app's own (its error middleware has answered 500 before raising) is logged here."""
    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "scheme": "http", "server": None, "root_path": "",
        "method": request.method, "path": request.path, "raw_path": request.raw_path,
        "query_string": request.query_string, "headers": request.headers,
        "client": request.client, "state": {},
    }
    done = asyncio.Event()
    sent = False
    status, headers, parts = 500, [], []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await done.wait()  # the client stays till the answer is whole
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], list(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    try:
        await app(scope, receive, send)
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        if not parts:
            return Replied(500, [(b"content-type", b"text/plain; charset=utf-8")],
                           b"Internal Server Error")
    finally:
        done.set()
    return Replied(status, headers, b"".join(parts))
