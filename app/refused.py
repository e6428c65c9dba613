"""The answers batchserve's HTTP protocol (app/connection.py) gives itself, before any route:
each in the error format of the protocol its path names (app/api/error_responses.py), as a
route's error would be, and with the connection closed; and what a 400 says of bytes that are not
HTTP/1.1."""

from __future__ import annotations

import httptools
from starlette.types import Receive, Scope, Send

from app.api.error_responses import format_for_path


def refusal(status: int, reason: str, kind: str, message: str, path: str) -> bytes:
    """The whole response refusing a request for ``path``: status line, headers, JSON body."""
    body = bytes(format_for_path(path).render(status, kind, message).body)
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


async def over_connections(scope: Scope, receive: Receive, send: Send) -> None:
    """The 503 past ``max_connections`` as the server's other overload is answered: ``busy``
    in the path's error format, with ``Retry-After`` (uvicorn's is plain text without it), and
    the connection closed, being one too many."""
    await format_for_path(scope["path"]).render(
        503, "busy", "the process holds as many connections and requests as max_connections "
        "lets it", {"Retry-After": "1", "Connection": "close"})(scope, receive, send)


def parser_said(exc: httptools.HttpParserError) -> str:
    """What the parser found wrong, in a client's terms where llhttp's are its own."""
    if isinstance(exc.__context__, httptools.HttpParserInvalidURLError):  # "User callback error"
        return f"its target is not a path: {exc.__context__}"
    if str(exc) == "Pause on PRI/Upgrade":  # HTTP/2's preface: h2c with prior knowledge, gRPC
        return "it is HTTP/2; this port serves HTTP/1.1 (gRPC has a port of its own, grpc_port)"
    return str(exc)
