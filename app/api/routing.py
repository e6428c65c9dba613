"""Raw ASGI routes, and the app that finds them before FastAPI's middleware stack.

The inference endpoints are raw ASGI callables mounted as Starlette mounts one (a ``Route`` whose
endpoint is not a function): no request object, no dependency injection. FastAPI then puts six
layers in front of every route (server errors, telemetry, body limit, user middleware,
exceptions, exit stack) and a router; on ``linear`` at concurrency 64 they cost a quarter of the
requests per second (docs/benchmarks.md). So ``BatchServeApp`` matches its raw routes first, with
Starlette's own ``Route.matches``, and runs them under the access log alone. Everything else, and
a raw route reached through the router, takes the usual path to the same endpoint.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.access import AccessLog
from app.api.errors import BATCHSERVE, ErrorFormat, error_response
from app.errors import ServeError

log = logging.getLogger("batchserve.api")


class RawRoute(Route):
    """A route to a raw ASGI endpoint, with its OpenAPI operation and its protocol's error form.

    It turns its endpoint's exceptions into responses itself (through ``error_response``, as the
    app's exception handlers do), so it answers the same on either path."""

    def __init__(self, path: str, endpoint: ASGIApp, method: str, operation: dict[str, Any],
                 error_format: ErrorFormat = BATCHSERVE) -> None:
        super().__init__(path, endpoint, methods=[method])
        self.operation = {method.lower(): operation}
        self.error_format = error_format

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().handle(scope, receive, send)  # Starlette's: 405 for other methods
        except Exception as exc:
            if not isinstance(exc, ServeError):
                log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            await error_response(exc, self.error_format)(scope, receive, send)


class BatchServeApp(FastAPI):
    """FastAPI, whose raw routes are matched before its middleware stack (module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.raw_routes: list[RawRoute] = []
        self._direct = AccessLog(self._dispatch)

    def add_raw_route(self, route: RawRoute) -> None:
        """Mount ``route`` first in the router (tried in order) and in the direct path."""
        self.router.routes.insert(len(self.raw_routes), route)
        self.raw_routes.append(route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self.raw_routes:
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child_scope)
                    scope["app"] = self
                    scope["route"] = route
                    await self._direct(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        await scope["route"].handle(scope, receive, send)
