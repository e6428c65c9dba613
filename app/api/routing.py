"""Raw ASGI routes, and the app that finds them before FastAPI's middleware stack.

The inference endpoints are raw ASGI callables mounted as Starlette mounts one (a ``Route`` whose
endpoint is not a function): no request object, no dependency injection. FastAPI then puts six
layers in front of every route (server errors, telemetry, body limit, user middleware,
exceptions, exit stack) and a router; on ``linear`` at concurrency 64 they cost a quarter of the
requests per second (docs/benchmarks.md, "linear"). So ``BatchServeApp`` matches its raw
routes first (a dict lookup for those without path parameters, Starlette's own
``Route.matches`` for the others) and runs them under the access log alone. Everything else,
and a raw route reached through the router, takes the usual path to the same endpoint.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.access import AccessLog
from app.api.error_responses import BATCHSERVE, ErrorFormat, error_response
from app.errors import ServeError

log = logging.getLogger("batchserve.api")


class RawRoute(Route):
    """A route to a raw ASGI endpoint, with its OpenAPI operation and its protocol's error form.

    It turns its endpoint's exceptions into responses itself (through ``error_response``, as the
    app's exception handlers do), so it answers the same on either path."""

    def __init__(self, path: str, endpoint: ASGIApp, method: str,
                 operation: dict[str, Any] | None, error_format: ErrorFormat = BATCHSERVE
                 ) -> None:
        """``operation``: the route's OpenAPI operation; None leaves it out of the schema."""
        super().__init__(path, endpoint, methods=[method],
                         include_in_schema=operation is not None)
        self.method = method
        self.operation = {method.lower(): operation} if operation is not None else {}
        self.error_format = error_format

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != self.method:  # a client's mistake: 405, nothing logged
            allowed = HTTPException(405, headers={"Allow": self.method})
            await error_response(allowed, self.error_format)(scope, receive, send)
            return
        await self.serve(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the endpoint for a request whose path and method match."""
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            if not isinstance(exc, ServeError):
                log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            await error_response(exc, self.error_format)(scope, receive, send)


def head_too(route: BaseRoute) -> None:
    """A GET route answers HEAD as well (its status and headers; the server sends no body), as
    every HTTP server must (RFC 9110, 9.1), and a 405 elsewhere lists both. FastAPI's routes,
    unlike Starlette's, take only the methods they name; the schema keeps the GET alone
    (``get_alone``)."""
    methods = getattr(route, "methods", None)
    if methods is not None and "GET" in methods:
        methods.add("HEAD")


def get_alone(route: BaseRoute) -> BaseRoute:
    """``route`` as the schema shows it: a GET that answers HEAD too as one operation, not two
    (which would share one operation id)."""
    methods = getattr(route, "methods", None)
    if not methods or "HEAD" not in methods or "GET" not in methods:
        return route
    shown = copy.copy(route)
    shown.methods = methods - {"HEAD"}  # type: ignore[attr-defined]
    return shown


class BatchServeApp(FastAPI):
    """FastAPI, whose raw routes are matched before its middleware stack (module docstring)."""

    def __init__(self, access_level: int = logging.INFO, **kwargs: Any) -> None:
        """``access_level``: the level of the raw routes' access lines (``AccessLog``). A path
        with a trailing slash no route has is a 404, not a redirect to the path without it
        (which would name the host and scheme as this server saw them, not as the client did)."""
        kwargs.setdefault("redirect_slashes", False)
        super().__init__(**kwargs)
        self.raw_routes: list[RawRoute] = []
        self._fixed: dict[str, RawRoute] = {}  # raw routes without path parameters, by path
        self._direct = AccessLog(self._dispatch, access_level)

    def add_raw_route(self, route: RawRoute) -> None:
        """Mount ``route`` first in the router (tried in order) and in the direct path."""
        self.router.routes.insert(len(self.raw_routes), route)
        self.raw_routes.append(route)
        if not route.param_convertors:
            self._fixed[route.path] = route

    def add_router(self, router: APIRouter) -> None:
        """``router``'s routes (their paths, tags and route class set where it was made), in
        this app's own list, each GET answering HEAD too (``head_too``). FastAPI 0.165's
        ``include_router`` keeps an included router as one route that matches through its
        routes with a context of its own: about 20 us more for every request that is not a raw
        route (a 404 100 -> 78 us, a model's metadata 220 -> 184; docs/benchmarks.md, "Floods of
        probes and other requests")."""
        for route in router.routes:
            head_too(route)
        self.router.routes.extend(router.routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._match(scope) if scope["type"] == "http" else None
        if found is None:
            await super().__call__(scope, receive, send)
            return
        route, child_scope = found
        scope.update(child_scope, app=self, route=route)
        await self._direct(scope, receive, send)

    def _match(self, scope: Scope) -> tuple[RawRoute, Scope] | None:
        """The raw route that matches ``scope`` in full (path and method), with its child scope."""
        route = self._fixed.get(scope["path"])
        if route is not None and scope["method"] == route.method and not scope.get("root_path"):
            return route, {"endpoint": route.endpoint, "path_params": {}}  # Starlette's result
        for route in self.raw_routes:
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                return route, child_scope
        return None

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        await scope["route"].serve(scope, receive, send)  # matched in full: path and method
