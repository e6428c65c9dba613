"""A front end's app: the inference routes served here, everything else from the device process.

``POST /predict`` (and per model) and ``POST /v2/models/{name}/infer`` run the same
``run_inference`` as a single process, over ``RemoteService``. Every other path (health, metrics,
metadata, configuration, the repository, the OpenAPI page) is asked of the device process's own
app over the link (app/asks.py), so each has one answer whichever front end a client reaches.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.api import error_responses as errors
from app.api import predict
from app.api.access import HEALTH_PATHS, REQUEST_ID_HEADER, AccessLog
from app.api.body import LIKELY_WHOLE, ClientGone, read_body
from app.api.relay import REPOSITORY_CHANGES, Relay
from app.api.routing import BatchServeApp
from app.api.v2.infer import infer_routes
from app.asks import asked
from app.errors import ServeError, Unavailable
from app.frontend.remote import RemoteService
from app.links import connect
from app.logs import request_id
from app.version import __version__

# Hop-by-hop headers, and the request id (the app is given this front end's). The client's
# Host goes on: the device process's app sees the request as one process would.
_DROPPED = {b"connection", b"transfer-encoding", b"keep-alive", REQUEST_ID_HEADER}
# A front end's own server sends its date and name, and the length of what it sends.
_DROPPED_OUT = {b"connection", b"content-length", b"transfer-encoding", b"keep-alive", b"date",
                b"server", REQUEST_ID_HEADER}


class DeviceProxy:
    """Has the device process's app answer a request (over the link, app/asks.py) and gives
    its answer back; 503 ``unhealthy`` when that process has gone or does not answer in time
    (app/api/relay.py). After a repository change (load, unload) it waits for this front end to
    hold the new model snapshot, so the next request finds what was loaded.

    Probes and scrapes asked while the same one is on its way share its answer (``Relay``): a
    flood of them on these open paths would otherwise ask the device process once each
    (docs/frontends.md)."""

    def __init__(self, service: RemoteService) -> None:
        self.service = service
        self._relay = Relay(service.link.ask)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._forward(scope, receive)
        await response(scope, receive, send)

    async def _forward(self, scope: Scope, receive: Receive) -> Response:
        headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED]
        rid = request_id.get()
        if rid is not None:
            headers.append((REQUEST_ID_HEADER, rid.encode()))
        arriving = self.service.arriving
        try:
            body = await read_body(receive, self.service.settings.max_body_bytes,
                                   dict(scope["headers"]).get(b"content-length"), arriving)
            # A long body keeps its room till the device process answers: this process holds
            # it meanwhile, and one that parses slower than clients send would pile them up.
            held = len(body) if len(body) > LIKELY_WHOLE else 0
            arriving.take(held)
        except ClientGone:
            return Response(status_code=499)
        except ServeError as exc:
            return errors.error_response(exc, errors.format_for_path(scope["path"]))
        path, method = scope["path"], scope["method"]
        try:
            answer = await self._relay(asked(scope, headers, body))
        except Unavailable as exc:  # gone, or not answering in time
            return _unreachable(path, str(exc))
        finally:
            arriving.give_back(held)
        if method == "POST" and path.startswith(REPOSITORY_CHANGES):
            await self.service.link.sync()
        response = Response(answer.body, status_code=answer.status)
        response.raw_headers.extend(
            (k, v) for k, v in answer.headers if k.lower() not in _DROPPED_OUT)
        if method == "HEAD":  # a GET's length, whatever body the app sent
            for k, v in answer.headers:
                if k.lower() == b"content-length":
                    response.headers["content-length"] = v.decode("latin-1")
        return response


def _unreachable(path: str, reason: str) -> Response:
    if path in HEALTH_PATHS:
        return Response(orjson.dumps({"status": "unhealthy", "reason": reason}),
                        status_code=503, media_type="application/json",
                        headers={"Retry-After": "1"})
    return errors.error_response(Unavailable("unhealthy", reason), errors.format_for_path(path))


def create_frontend_app(service: RemoteService, link: socket.socket) -> FastAPI:
    """The app of one front end: ``link`` is its socket to the device process (opened in the
    lifespan, before the first request is taken)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start(*await connect(link))
        try:
            yield
        finally:
            await service.stop()

    app = BatchServeApp(title="batchserve", version=__version__, lifespan=lifespan,
                        docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    errors.install(app)
    for route in [*predict.routes(service, {}), *infer_routes(service)]:
        app.add_raw_route(route)
    proxy = DeviceProxy(service)
    # Every other path and method (the device process's app answers 404 or 405 as one process
    # would), a decoded newline in the path too (an escaped one reaches a model's name).
    rest = Route("/{path:path}", proxy)
    rest.path_regex = re.compile(rest.path_regex.pattern, re.DOTALL)
    app.router.routes.append(rest)
    app.add_middleware(AccessLog)
    return app
