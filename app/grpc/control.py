"""The gRPC calls that are not inference, answered by the server's own HTTP app.

Health, metadata, Triton's configuration and the model repository already have one answer per
server: the v2 routes of the process that holds the repository. A gRPC call is sent there as the
HTTP request it stands for (in-process through ASGI in a single process, over the device
process's Unix socket from a front end), with the caller's request id and credentials, so both
protocols share every rule and word, and a load through either is seen by both at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
import orjson

from app.api.access import HELD, is_probe, proxy_timeout
from app.errors import Relayed
from app.logs import request_id
from app.tasks import Shared

PASSED_ON = ("authorization",)  # the call's metadata the app reads, besides its request id


class Control:
    def __init__(self, client: httpx.AsyncClient,
                 changed: Callable[[], Awaitable[None]] | None = None) -> None:
        """``client`` reaches the app; ``changed`` is awaited after a load or unload (a front
        end takes the device process's new model snapshot then)."""
        self._client = client
        self._changed = changed
        self._shared = Shared()  # probes asked again while on their way (``is_probe``)

    async def get(self, path: str, metadata: Mapping[str, str],
                  params: Mapping[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) of a GET; Relayed for an error other than 503, which health and
        readiness answer with a body of their own. A health check not answered within
        HEALTH_TIMEOUT_S is 503 unhealthy, as a front end answers it over HTTP."""
        def ask() -> Awaitable[httpx.Response]:
            return self._request("GET", path, metadata, params=params,
                                 timeout=proxy_timeout(path))

        try:
            if is_probe(path):
                answer = await self._shared((path, tuple(sorted((params or {}).items()))), ask)
            else:
                answer = await ask()
        except httpx.TimeoutException:
            return 503, {"status": "unhealthy", "reason": HELD}
        if answer.status_code >= 400 and answer.status_code != 503:
            raise _relayed(answer)
        return answer.status_code, orjson.loads(answer.content)

    async def post(self, path: str, metadata: Mapping[str, str],
                   body: Mapping[str, Any] | None = None,
                   changes_models: bool = False) -> dict[str, Any] | list[Any]:
        """The JSON answer of a POST (empty: {}); Relayed for any error. ``changes_models``:
        a load or unload, after which ``changed`` is awaited whatever the answer."""
        answer = await self._request("POST", path, metadata,
                                     content=orjson.dumps(body or {}))
        if changes_models and self._changed is not None:
            await self._changed()
        if answer.status_code >= 400:
            raise _relayed(answer)
        return orjson.loads(answer.content) if answer.content else {}

    async def _request(self, method: str, path: str, metadata: Mapping[str, str],
                       **kwargs: Any) -> httpx.Response:
        headers = {name: metadata[name] for name in PASSED_ON if name in metadata}
        rid = request_id.get()
        if rid is not None:
            headers["x-request-id"] = rid
        try:
            return await self._client.request(method, path, headers=headers, **kwargs)
        except httpx.TimeoutException:  # a TransportError too, but the caller's to answer
            raise
        except httpx.TransportError:
            raise Relayed(503, "unhealthy", "the device process has stopped", 1) from None


def _relayed(answer: httpx.Response) -> Relayed:
    """The app's error answer (either error form) as the same status and message."""
    try:
        error = orjson.loads(answer.content).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, dict):
        type_, message = str(error.get("type")), str(error.get("message"))
    else:
        type_, message = "error", str(error) if error is not None else answer.reason_phrase
    retry = answer.headers.get("retry-after")
    return Relayed(answer.status_code, type_, message,
                   int(retry) if retry and retry.isdigit() else None)
