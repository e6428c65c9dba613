"""How the server's own app is asked what a front end (or gRPC) relays to it: a request that
is not inference (app/asks.py: in-process, or over a front end's link to the device process).

A health or readiness check waits ``HEALTH_TIMEOUT_S`` at most, a load or unload as long as it
takes (minutes, for a large model), anything else (metadata, /metrics, a 404) ``ASK_TIMEOUT_S``:
past it, the answer is 503 unhealthy ("the device process did not answer within ..."), the
device process's event loop being held (a call stuck holding the GIL, a deadlock), rather than
a request held until its client gives up. Probes and scrapes asked while the same one is on its
way share its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from app.api.access import HEALTH_PATHS
from app.asks import Ask, Asked, Replied
from app.errors import Unavailable
from app.tasks import Shared

HEALTH_TIMEOUT_S = 5.0
ASK_TIMEOUT_S = 30.0  # an answer of the app's own takes milliseconds; a slow one, a second
REPOSITORY_CHANGES = "/v2/repository/models/"  # a POST under it loads or unloads


def held(seconds: float) -> str:
    return f"the device process did not answer within {seconds:g} s"


def is_readiness(path: str) -> bool:
    """Health, liveness and readiness, the server's or a model's: what probes ask."""
    return path in HEALTH_PATHS or (path.startswith("/v2/models/") and path.endswith("/ready"))


def is_probe(path: str) -> bool:
    """Readiness and /metrics: open paths that probes and scrapers ask for often, whose answer
    depends on no header."""
    return is_readiness(path) or path == "/metrics"


def proxy_timeout(method: str, path: str) -> float | None:
    """How long the app's answer to ``method path`` is waited for (None: as long as it takes)."""
    if is_readiness(path):
        return HEALTH_TIMEOUT_S
    if method == "POST" and path.startswith(REPOSITORY_CHANGES):
        return None
    return ASK_TIMEOUT_S


class Relay:
    """Has the app answer requests through ``ask``; Unavailable (503 unhealthy) past
    ``proxy_timeout``. A GET or HEAD without a body of ``is_probe``'s paths (open, the same
    answer for every client) asked while the same one is on its way shares its answer
    (``Shared``): a flood of them costs the app one at a time."""

    def __init__(self, ask: Ask) -> None:
        self._ask = ask
        self._shared = Shared()

    def __call__(self, request: Asked) -> Awaitable[Replied]:
        async def call() -> Replied:
            limit = proxy_timeout(request.method, request.path)
            if limit is None:
                return await self._ask(request)
            try:
                return await asyncio.wait_for(self._ask(request), limit)
            except TimeoutError:
                raise Unavailable("unhealthy", held(limit)) from None

        if not request.body and request.method in ("GET", "HEAD") and is_probe(request.path):
            return self._shared((request.method, request.raw_path, request.query_string), call)
        return call()
