"""A front end's app: the inference routes served here, everything else from the device process.

``POST /predict`` (and per model) and ``POST /v2/models/{name}/infer`` run the same
``run_inference`` as a single process, over ``RemoteService``. Every other path (health, metrics,
metadata, configuration, the repository, the OpenAPI page) is proxied to the device process's
own app on its private Unix socket, so each has one answer whichever front end a client reaches.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import quote, quote_from_bytes

import httpx
import orjson
from fastapi import FastAPI
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.api import error_responses as errors
from app.api import predict
from app.api.access import (
    HEALTH_PATHS,
    HELD,
    REQUEST_ID_HEADER,
    AccessLog,
    is_probe,
    proxy_timeout,
)
from app.api.body import ClientGone, read_body
from app.api.routing import BatchServeApp
from app.api.v2.infer import infer_routes
from app.errors import ServeError, Unavailable
from app.frontend.link import GONE
from app.frontend.remote import RemoteService
from app.links import connect
from app.logs import request_id
from app.tasks import Shared
from app.version import __version__

# Hop-by-hop headers and those the proxy's own answer sets. The client's Host goes on: the
# device process's app sees the request as one process would.
_DROPPED = {b"connection", b"content-length", b"transfer-encoding", b"keep-alive",
            REQUEST_ID_HEADER}
# A front end's own server sends its date and name, and the length of what it sends.
_DROPPED_OUT = {"connection", "content-length", "transfer-encoding", "keep-alive", "date",
                "server", REQUEST_ID_HEADER.decode()}
_REPOSITORY_PREFIX = "/v2/repository/"
_VISIBLE = "".join(map(chr, range(0x21, 0x7F)))  # what a request target holds unescaped


class DeviceProxy:
    """Forwards a request to the device process's app and its answer back; 503 ``unhealthy``
    when that process cannot be reached. After a repository change (load, unload) it waits for
    this front end to hold the new model snapshot, so the next request finds what was loaded.

    Probes and scrapes (a GET or HEAD without a body of ``is_probe``'s paths: open, the same
    answer for every client) asked while the same one is on its way share its answer
    (``Shared``): each costs the device process a few hundred us and this front end over a ms
    through the proxy, and a flood of them on these open paths took two thirds of the server's
    inference (docs/frontends.md)."""

    def __init__(self, service: RemoteService, client: Callable[[], httpx.AsyncClient]) -> None:
        self.service = service
        self._client = client
        self._shared = Shared()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._forward(scope, receive)
        await response(scope, receive, send)

    async def _forward(self, scope: Scope, receive: Receive) -> Response:
        headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED]
        rid = request_id.get()
        if rid is not None:
            headers.append((REQUEST_ID_HEADER, rid.encode()))
        try:
            body = await read_body(receive, self.service.settings.max_body_bytes,
                                   dict(scope["headers"]).get(b"content-length"))
        except ClientGone:
            return Response(status_code=499)
        except ServeError as exc:
            return errors.error_response(exc)
        path = scope["path"]
        target = proxied_target(scope)
        method = scope["method"]

        def ask() -> Awaitable[httpx.Response]:
            return self._client().request(method, target, headers=headers, content=body,
                                          timeout=proxy_timeout(path))

        try:
            if not body and method in ("GET", "HEAD") and is_probe(path):
                answer = await self._shared((method, target), ask)
            else:
                answer = await ask()
        except httpx.TimeoutException:
            return _unreachable(path, HELD)
        except httpx.TransportError:
            return _unreachable(path, GONE)
        if scope["method"] == "POST" and path.startswith(_REPOSITORY_PREFIX):
            await self.service.link.sync()
        response = Response(answer.content, status_code=answer.status_code)
        if scope["method"] == "HEAD" and "content-length" in answer.headers:
            response.headers["content-length"] = answer.headers["content-length"]  # a GET's
        response.raw_headers.extend(
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in answer.headers.multi_items() if k.lower() not in _DROPPED_OUT)
        return response


def proxied_target(scope: Scope) -> str:
    """The path and query to ask the device process for: as the client sent them (``raw_path``:
    still percent-encoded, so an escaped ``/`` stays one segment), with any byte a URL cannot
    hold escaped, and ``.`` and ``..`` segments too, which the client would otherwise resolve.
    The decoded path may hold control characters, which no URL may carry."""
    raw = scope.get("raw_path")
    path = (quote_from_bytes(raw, safe=_VISIBLE) if raw is not None
            else quote(scope["path"], safe=_VISIBLE.replace("%", "")))
    if "/." in path:  # dot segments escaped: httpx would resolve them, one process does not
        path = "/".join("%2E" * len(part) if part in (".", "..") else part
                        for part in path.split("/"))
    query = scope.get("query_string", b"")
    return path + ("?" + quote_from_bytes(query, safe=_VISIBLE) if query else "")


def _unreachable(path: str, reason: str) -> Response:
    if path in HEALTH_PATHS:
        return Response(orjson.dumps({"status": "unhealthy", "reason": reason}),
                        status_code=503, media_type="application/json",
                        headers={"Retry-After": "1"})
    return errors.error_response(Unavailable("unhealthy", reason))


def create_frontend_app(service: RemoteService, link: socket.socket,
                        device_socket: str) -> FastAPI:
    """The app of one front end: ``link`` is its socket to the device process (opened in the
    lifespan, before the first request is taken), ``device_socket`` the path of that process's
    own app."""
    clients: list[httpx.AsyncClient] = []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start(*await connect(link))
        clients.append(httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=device_socket), base_url="http://device",
            timeout=None))
        try:
            yield
        finally:
            await clients[0].aclose()
            await service.stop()

    app = BatchServeApp(title="batchserve", version=__version__, lifespan=lifespan,
                        docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    errors.install(app)
    for route in [*predict.routes(service, {}), *infer_routes(service)]:
        app.add_raw_route(route)
    proxy = DeviceProxy(service, lambda: clients[0])
    rest = Route("/{path:path}", proxy, methods=[
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
    # Every other path, a decoded newline in it too (an escaped one reaches a model's name).
    rest.path_regex = re.compile(rest.path_regex.pattern, re.DOTALL)
    app.router.routes.append(rest)
    app.add_middleware(AccessLog)
    return app
