"""How the server's own app is asked what a front end (or gRPC) relays to it: a request that
is not inference (app/asks.py: in-process, or over a front end's link to the device process).

A health check waits ``HEALTH_TIMEOUT_S`` at most: a front end answers one the device process
has not answered by then itself, 503 unhealthy with ``HELD`` (its event loop is held: a call
stuck holding the GIL, a deadlock); anything else waits as long as it takes (a load may take
minutes). Probes and scrapes asked while the same one is on its way share its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from app.api.access import HEALTH_PATHS
from app.asks import Ask, Asked, Replied
from app.tasks import Shared

HEALTH_TIMEOUT_S = 5.0
HELD = f"the device process did not answer within {HEALTH_TIMEOUT_S:g} s"


def is_probe(path: str) -> bool:
    """Health, readiness and /metrics: open paths that probes and scrapers ask for often, whose
    answer depends on no header."""
    return path in HEALTH_PATHS or path == "/metrics" or (
        path.startswith("/v2/models/") and path.endswith("/ready"))


def proxy_timeout(path: str) -> float | None:
    """How long the app's answer to ``path`` is waited for: a health check HEALTH_TIMEOUT_S,
    anything else as long as it takes."""
    return HEALTH_TIMEOUT_S if path in HEALTH_PATHS else None


class Relay:
    """Has the app answer requests through ``ask``; TimeoutError past ``proxy_timeout``. A GET
    or HEAD without a body of ``is_probe``'s paths (open, the same answer for every client)
    asked while the same one is on its way shares its answer (``Shared``): a flood of them
    costs the app one at a time."""

    def __init__(self, ask: Ask) -> None:
        self._ask = ask
        self._shared = Shared()

    def __call__(self, request: Asked) -> Awaitable[Replied]:
        def call() -> Awaitable[Replied]:
            return asyncio.wait_for(self._ask(request), proxy_timeout(request.path))

        if not request.body and request.method in ("GET", "HEAD") and is_probe(request.path):
            return self._shared((request.method, request.raw_path, request.query_string), call)
        return call()
