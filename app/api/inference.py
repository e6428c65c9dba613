"""The request flow shared by /predict and /v2/models/{name}/infer.

auth -> deadline -> size-limited body -> parse (protocol-specific) -> admit whole or refuse ->
decode -> enqueue -> await the results (dropping them if the client disconnects) -> render.

It works on the raw ASGI scope and ``receive``: this is the server's hottest path, and
Starlette's request object, a task per request and ``asyncio.timeout`` together cost as much
event-loop time as the rest of it (docs/benchmarks.md, "linear").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api.auth import check_auth
from app.api.body import CLIENT_CLOSED, ClientGone, read_inflated
from app.api.error_responses import format_of
from app.api.headers import (
    PRIORITY_HEADER,
    TIMEOUT_HEADER,
    priority_header,
    request_timeout_s,
)
from app.arrays import Results
from app.arriving import Arriving
from app.config import Settings
from app.errors import ServeError
from app.facade import ModelFacade, RequestCounts, Waiting
from app.tracing import Tracing, carrier_of

# Set by app/connection.py in the scope of a request it cut off and answered itself (a 408 for
# one slow to arrive, a 431 for trailers past the bound): (status, the rejection's type).
CUT_OFF = "batchserve.cut_off"
WATCH_AFTER_S = 0.02  # a request still unanswered after this starts watching for a disconnect

Parsed = TypeVar("Parsed")
# A protocol's body parser (model, body, headers by lower-case name) and answer renderer.
Parse = Callable[[ModelFacade, bytes, dict[bytes, bytes]], tuple[list[Any], Parsed, "Asked"]]
Render = Callable[[ModelFacade, Results, Parsed], Response]


class Models(Protocol):
    moves: int  # changes when a name's default traffic may have moved

    def get(self, name: str | None = None, version: str | None = None) -> ModelFacade: ...


class Serving(Protocol):
    """What the request path needs of the server: the InferenceService of a single process, or
    a front end's view of the device process (app/frontend/remote.py)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def repository(self) -> Models: ...

    @property
    def unknown(self) -> RequestCounts: ...  # requests for no model the server knows

    @property
    def tracing(self) -> Tracing | None: ...

    @property
    def arriving(self) -> Arriving: ...  # the bodies still arriving in this process


@dataclass(frozen=True)
class Asked:
    """What a request's body asks for besides its instances; None leaves it to the headers and
    the model's settings."""

    priority: int | None = None  # 0: the model's default level
    timeout_s: float | None = None  # shortens the deadline, never lengthens it; 0: none asked


NOTHING_ASKED = Asked()


class DisconnectWatch:
    """Lets a request go when its client disconnects: while its items decode in the pool, by
    cancelling the request's task in that wait (the decode runs on, its outcome dropped); once
    queued, by cancelling its future, so its items are dropped instead of computed. Watching
    takes a task, so it starts only once the request has waited ``WATCH_AFTER_S``: answers
    faster than that (most, unless the server is queueing) never pay for it."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._request = asyncio.current_task()
        self._pending: Waiting | None = None
        self._task: asyncio.Task[None] | None = None
        self._cut = False  # it cancelled the request's task
        self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._start)

    def queued(self, pending: Waiting) -> None:
        """The request's items are queued: from now on a disconnect cancels its future."""
        self._pending = pending

    def _start(self) -> None:
        if self._pending is None or not self._pending.future.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if self._pending is not None:
            self._pending.future.cancel()
        elif self._request is not None:  # decoding in the pool: the only wait before it queues
            self._cut = True
            self._request.cancel()

    def let_go(self) -> bool:
        """Whether the request's CancelledError is this watch's doing (its client left), not a
        cancel from outside; its own cancel of the task is undone."""
        task, request = self._task, self._request
        if task is None or not task.done() or task.cancelled() or request is None:
            return False
        if self._cut:
            return request.uncancel() == 0
        return not request.cancelling()

    def close(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            # Let go of it: the task keeps its CancelledError, whose frames hold this watch,
            # and a reference cycle would leave the request's objects to the collector.
            self._task = None


async def submit(model: ModelFacade, instances: list[Any], level: int, deadline: float,
                 span: Any) -> Waiting:
    """Admit a parsed request whole (refused before anything is decoded), decode it and queue
    its items: what every protocol does between parsing and awaiting the answer."""
    model.check_admissible(len(instances), level, deadline)
    # An inline decode lets nothing run before the put: the check above still holds then.
    admitted = len(instances) if model.decodes_inline(instances) else None
    items = await model.decode(instances, deadline)
    return model.enqueue(items, deadline, level, span, admitted=admitted)


def looked_up(service: Serving, name: str | None, version: str | None
              ) -> tuple[ModelFacade | None, ServeError | None, RequestCounts]:
    """The model version a request names, or why there is none (unknown, loading, its load
    failed): raised after the auth check, so a name leaks nothing to a client without
    credentials; and where the request is counted (without a model: under ``model=""``)."""
    try:
        model = service.repository.get(name, version)
    except ServeError as exc:
        return None, exc, service.unknown
    return model, None, model.metrics


async def run_inference(scope: Scope, receive: Receive, service: Serving, name: str | None,
                        version: str | None, parse: Parse[Parsed], render: Render[Parsed]
                        ) -> Response:
    """Serve one inference request for model ``name`` (None: the default) at ``version`` (None:
    the one taking its default traffic); ``parse`` gives, from the body and the request's
    headers, (instances, context for ``render``, what the body asks for: its priority wins over
    ``X-Priority``, and the shortest of its timeout, ``X-Request-Timeout`` and the model's
    ``request_timeout_s`` sets the deadline).

    Raises ServeError for the caller's error conversion (app/api/error_responses.py), in the form of
    the route's protocol: the metrics count the status the client is answered with."""
    arrived = time.monotonic()
    settings = service.settings
    model, missing, metrics = looked_up(service, name, version)
    moves = service.repository.moves
    status = 500
    headers = dict(scope["headers"])
    tracing = service.tracing
    span = None
    if tracing is not None:
        span = tracing.start(f"{scope['method']} {scope['path']}", carrier_of(headers), arrived,
                             {"batchserve.model": model.name if model is not None else ""})
    try:
        check_auth(headers.get(b"authorization"), settings.api_key)
        if model is None:
            assert missing is not None
            raise missing
        deadline = arrived + request_timeout_s(headers.get(TIMEOUT_HEADER),
                                               model.settings.request_timeout_s)
        body = await read_inflated(receive, settings.max_body_bytes,
                                   headers.get(b"content-length"),
                                   headers.get(b"content-encoding"), service.arriving)
        if version is None and service.repository.moves != moves:
            # The name's default traffic moved while the body came (a rolling update): the
            # version serving it now takes the request, not one that may have begun to drain.
            model = service.repository.get(name)
            metrics = model.metrics
        instances, context, asked = parse(model, body, headers)
        priority = asked.priority
        if priority is None:
            priority = priority_header(headers.get(PRIORITY_HEADER))
        if asked.timeout_s:
            deadline = min(deadline, arrived + asked.timeout_s)
        watch = DisconnectWatch(receive)
        try:
            pending = await submit(model, instances, model.level_of(priority), deadline, span)
            watch.queued(pending)
            results = await model.result(pending)
        except asyncio.CancelledError:
            if watch.let_go():
                raise ClientGone from None
            raise
        finally:
            watch.close()
        response = render(model, results, context)
        status = response.status_code
        return response
    except ClientGone:
        cut_off = scope.get(CUT_OFF)
        if cut_off is not None:  # cut off by the protocol, which answered it itself
            status, kind = cut_off
            metrics.rejected(kind)
        else:
            status = CLIENT_CLOSED
            metrics.rejected("disconnected")
        return Response(status_code=status)
    except ServeError as exc:
        status = format_of(scope).status_of(exc.status)
        if status != 500:
            metrics.rejected(exc.reason)
        raise
    finally:
        ended = time.monotonic()
        metrics.answered(status, ended - arrived)
        if span is not None:
            assert tracing is not None
            tracing.end(span, status, ended)


class InferenceEndpoint(Generic[Parsed]):
    """An inference route's endpoint: an instance, not a function, so Starlette mounts it as raw
    ASGI (app/api/routing.py). The model comes from the path (``name``, ``version``), or is the
    server's default one; ``parse`` and ``render`` are the protocol's."""

    def __init__(self, service: Serving, parse: Parse[Parsed], render: Render[Parsed]) -> None:
        self.service = service
        self.parse = parse
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope.get("path_params") or {}
        response = await run_inference(scope, receive, self.service, params.get("name"),
                                       params.get("version"), self.parse, self.render)
        await response(scope, receive, send)
