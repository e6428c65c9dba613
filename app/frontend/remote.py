"""A front end's view of the device process (docs/frontends.md).

``RemoteService`` is what the request path (app/api/inference.py) needs of a server: settings,
``repository.get`` and the counts of requests for unknown models. Its models (``RemoteModel``)
decode with their own handler, built here from the model setting the device process names, and
enqueue by sending the decoded items over the link: admission, queueing and batching happen
there. Every request waiting here is answered exactly once: with what the device sends, or 503
``unhealthy`` if the device process goes away first.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import app.wire as wire
from app.bridge import ModelEntry, Snapshot
from app.config import Settings
from app.errors import BatchServeError, NotFound, Relayed, Unavailable
from app.facade import ModelFacade
from app.logs import request_id
from app.models.base import ModelHandler
from app.models.registry import load_handler
from app.repository import pick
from app.tracing import Tracing

log = logging.getLogger("batchserve.frontend")

GONE = "the device process has stopped"


@dataclass
class RemoteRequest:
    rid: int
    future: asyncio.Future[list[Any]]


class RemoteCounts:
    """A model's request counts, sent to the device process, whose registry /metrics shows."""

    def __init__(self, link: DeviceLink, name: str, version: str) -> None:
        self._link = link
        self._key = (name, version)

    def answered(self, status: int, seconds: float, protocol: str = "http") -> None:
        self._link.send("answered", (*self._key, status, seconds, protocol))

    def rejected(self, reason: str) -> None:
        self._link.send("rejected", (*self._key, reason))


class DeviceLink:
    """This front end's socket to the device process: requests out, results and the model
    snapshot in."""

    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future[list[Any]]] = {}
        self.snapshot = Snapshot()
        self.gone = False
        self.on_snapshot: list[Any] = []
        self._ids = itertools.count(1)
        self._syncs: dict[int, asyncio.Future[None]] = {}
        self._outbox: wire.Outbox | None = None
        self._reader: asyncio.StreamReader | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Start on a connected socket; returns once the first snapshot is in."""
        self._reader = reader
        self._outbox = wire.Outbox(writer)
        self._apply(await wire.read(reader))
        self._task = asyncio.get_running_loop().create_task(self._run(reader))

    def send(self, kind: str, entry: Any) -> None:
        if self._outbox is not None and not self.gone:
            self._outbox.add(kind, entry)

    def submit(self, entry: tuple[Any, ...], items: list[Any]) -> RemoteRequest:
        """Send one request (its id is filled in here) and return what will hold its answer."""
        rid = next(self._ids)
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = future
        if self._outbox is not None and not self.gone:
            self._outbox.add("requests", (rid, *entry, len(items)), items)
        return RemoteRequest(rid, future)

    async def sync(self) -> None:
        """Wait until every front end holds a snapshot taken after everything this one sent so
        far was handled (a load or unload it proxied)."""
        token = next(self._ids)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._syncs[token] = future
        self.send("sync", token)
        try:
            await future
        finally:
            self._syncs.pop(token, None)

    async def _run(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self._apply(await wire.read(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        self._lost()

    def _apply(self, message: dict[str, list[Any]]) -> None:
        values = wire.values_of(message, "results")
        at = 0
        for rid, error, n in message.get("results", ()):
            future = self.waiting.pop(rid, None)
            if future is not None and not future.done():
                if error is None:
                    future.set_result(values[at:at + n])
                else:
                    future.set_exception(Relayed(*error))
            at += n
        snapshots = message.get("models")
        if snapshots:
            self.snapshot = snapshots[-1]
            for callback in self.on_snapshot:
                callback(self.snapshot)
        for key in message.get("ack", ()):
            self.send("acked", key)
        for token in message.get("synced", ()):
            waiter = self._syncs.get(token)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _lost(self) -> None:
        """The device process is gone: everything waiting is answered 503 unhealthy."""
        if self.gone:
            return
        self.gone = True
        log.critical("%s; answering 503 and exiting", GONE)
        futures: list[asyncio.Future[Any]] = [*self.waiting.values(), *self._syncs.values()]
        for future in futures:
            if not future.done():
                future.set_exception(Unavailable("unhealthy", GONE))
        self.waiting.clear()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


class RemoteModel(ModelFacade):
    """A model version whose queue is in the device process."""

    def __init__(self, entry: ModelEntry, handler: ModelHandler, service: RemoteService) -> None:
        super().__init__(entry.name, entry.version, entry.settings, handler)
        self.outputs = entry.outputs
        self.metrics = RemoteCounts(service.link, entry.name, entry.version)
        self._service = service
        self._loop = service.loop
        self._pool = service.pool

    def check_admissible(self, n: int, level: int | None = None,
                         deadline: float | None = None) -> None:
        """Only what this process knows: the device process decides the rest when the request
        reaches it, against its queue."""
        self._service.check_open()

    def enqueue(self, items: list[Any], deadline: float, level: int | None = None,
                trace: Any = None, admitted: int | None = None) -> RemoteRequest:
        self._service.check_open()
        level = level or self.settings.default_level
        return self._service.link.submit(
            (self.name, self.version, level, deadline, request_id.get()), items)

    async def result(self, request: RemoteRequest) -> list[Any]:
        try:
            return await request.future
        finally:
            if not request.future.done():  # the client left: drop its items there too
                request.future.cancel()
                self._service.link.waiting.pop(request.rid, None)
                self._service.link.send("cancel", request.rid)


class RemoteRepository:
    """``get`` as ``ModelRepository.get`` resolves names, over the device's snapshot."""

    def __init__(self, service: RemoteService) -> None:
        self._service = service
        self._models: dict[tuple[str, str], RemoteModel] = {}
        self._handlers: dict[tuple[str, str], ModelHandler] = {}

    def get(self, name: str | None = None, version: str | None = None) -> RemoteModel:
        snap = self._service.link.snapshot
        if name is None:
            if snap.default is None:
                raise NotFound(snap.default_error)
            name = snap.default
        entry = pick(name, version, snap.served.get(name), snap.current.get(name),
                     snap.failed.get(name), lambda: snap.names)
        model = self._models.get((entry.name, entry.version))
        if model is None:
            raise Unavailable("unavailable", f"model '{name}' cannot be served by this front "
                                             "end (its handler could not be built)")
        return model

    def update(self, snap: Snapshot) -> None:
        """Models for a new snapshot; handlers are built once per model setting."""
        models = {}
        for versions in snap.served.values():
            for entry in versions.values():
                handler = self._handler(entry)
                if handler is not None:
                    models[(entry.name, entry.version)] = RemoteModel(entry, handler,
                                                                      self._service)
        self._models = models

    def _handler(self, entry: ModelEntry) -> ModelHandler | None:
        key = (entry.name, entry.spec)
        handler = self._handlers.get(key)
        if handler is None:
            try:
                handler = self._handlers[key] = load_handler(entry.spec, entry.name)
            except BatchServeError as exc:
                log.error("model %s: %s", entry.name, exc.message)
        return handler


class RemoteService:
    """The server as a front end's request path sees it (``app.api.inference.Serving``), and
    what ``DrainingServer`` watches: in flight, draining, and whether it must exit."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tracing = Tracing.configure(settings.otel_endpoint)  # each request's server span
        self.link = DeviceLink()
        self.repository = RemoteRepository(self)
        self.unknown = RemoteCounts(self.link, "", "")
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pool: ThreadPoolExecutor | None = None

    async def start(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.loop = asyncio.get_running_loop()
        self.pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                                       thread_name_prefix="decode")
        self.link.on_snapshot.append(self.repository.update)
        await self.link.open(reader, writer)
        self.repository.update(self.link.snapshot)

    async def stop(self) -> None:
        self.link.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)

    def check_open(self) -> None:
        if self.link.gone:
            raise Unavailable("unhealthy", GONE)
        if self.draining:
            raise Unavailable("draining", "the server is shutting down")

    def begin_drain(self) -> None:
        self.draining = True

    @property
    def in_flight(self) -> int:
        return len(self.link.waiting)

    @property
    def load_failed(self) -> bool:
        """The device process is gone: nothing will be served again (exit, non-zero)."""
        return self.link.gone

    @property
    def load_error(self) -> str:
        return GONE

    @property
    def status(self) -> str:
        if self.link.gone:
            return "unhealthy"
        return "draining" if self.draining else "ready"
