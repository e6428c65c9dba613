"""The gRPC calls that are not inference, answered by the server's own HTTP app.

Health, metadata, Triton's configuration and the model repository already have one answer per
server: the v2 routes of the process that holds the repository. A gRPC call is sent there as the
HTTP request it stands for (app/asks.py: in-process in a single process, over its link from a
front end), with the caller's request id and credentials, so both protocols share every rule
and word, and a load through either is seen by both at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote, urlencode

import orjson

from app.api.access import REQUEST_ID_HEADER
from app.api.relay import Relay, is_readiness
from app.asks import Ask, Asked, Replied
from app.errors import Relayed, Unavailable
from app.framing import decimal
from app.logs import request_id

PASSED_ON = ("authorization",)  # the call's metadata the app reads, besides its request id


class Control:
    def __init__(self, ask: Ask, changed: Callable[[], Awaitable[None]] | None = None) -> None:
        """``ask`` has the app answer; ``changed`` is awaited after a load or unload (a front
        end takes the device process's new model snapshot then)."""
        self._relay = Relay(ask)  # probes asked while the same is on its way share its answer
        self._changed = changed

    async def get(self, path: str, metadata: Mapping[str, str],
                  params: Mapping[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) of a GET; Relayed for an error, but for a health or readiness
        check's 503, which comes with a body of its own (metadata's 503, a model still
        loading, is an error). Unavailable where the device process has gone or does not
        answer in time (app/api/relay.py); a health or readiness check is then 503 unhealthy,
        as a front end answers it over HTTP."""
        try:
            answer = await self._request("GET", path, metadata, query=urlencode(params or {}))
        except Unavailable as exc:
            if not is_readiness(path):
                raise
            return 503, {"status": "unhealthy", "reason": str(exc)}
        if answer.status >= 400 and not (answer.status == 503 and is_readiness(path)):
            raise _relayed(answer)
        return answer.status, orjson.loads(answer.body)

    async def post(self, path: str, metadata: Mapping[str, str],
                   body: Mapping[str, Any] | None = None,
                   changes_models: bool = False) -> dict[str, Any] | list[Any]:
        """The JSON answer of a POST (empty: {}); Relayed for any error. ``changes_models``:
        a load or unload, after which ``changed`` is awaited whatever the answer."""
        answer = await self._request("POST", path, metadata, body=orjson.dumps(body or {}))
        if changes_models and self._changed is not None:
            await self._changed()
        if answer.status >= 400:
            raise _relayed(answer)
        return orjson.loads(answer.body) if answer.body else {}

    async def _request(self, method: str, path: str, metadata: Mapping[str, str],
                       body: bytes = b"", query: str = "") -> Replied:
        """The app's answer to ``method path?query`` (``path`` URL-encoded); Unavailable (503
        unhealthy) if the device process has gone or does not answer in time."""
        headers = [(name.encode(), metadata[name].encode("latin-1"))
                   for name in PASSED_ON if name in metadata]
        rid = request_id.get()
        if rid is not None:
            headers.append((REQUEST_ID_HEADER, rid.encode()))
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        asked = Asked(method, unquote(path), path.encode(), query.encode(), headers, None, body)
        return await self._relay(asked)


def _relayed(answer: Replied) -> Relayed:
    """The app's error answer (either error form) as the same status and message."""
    try:
        error = orjson.loads(answer.body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, dict):
        type_, message = str(error.get("type")), str(error.get("message"))
    else:
        type_ = "error"
        message = str(error) if error is not None else _phrase(answer.status)
    retry = decimal(dict(answer.headers).get(b"retry-after", b""))
    return Relayed(answer.status, type_, message, retry)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:  # a status the standard does not name
        return ""
