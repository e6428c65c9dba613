"""A front end's view of the device process (docs/frontends.md).

``RemoteService`` is what the request path (app/api/inference.py) needs of a server: settings,
``repository.get`` and the counts of requests for unknown models. Its models (``RemoteModel``)
decode with the handler the device process sends (its own without the module), or one built
here from the model setting where it sends none, and enqueue by sending the decoded items over
the link (app/frontend/link.py, which answers each request exactly once): admission, queueing
and batching happen there.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from app.arrays import Results
from app.arriving import Arriving, receiving_bytes
from app.config import Settings
from app.errors import NotFound, Unavailable
from app.facade import ModelFacade, decode_pool
from app.frontend.handlers import handler_for
from app.frontend.link import GONE, DeviceLink, RemoteRequest
from app.links import Inbox
from app.logs import request_id
from app.models.base import ModelHandler
from app.process import refrozen
from app.snapshot import ModelEntry, Snapshot
from app.tasks import DaemonPool, on_own_thread
from app.tracing import Tracing
from app.versions import pick

START_MAKING_S = 5.0  # the longest a front end's start waits for its models' handlers


class RemoteCounts:
    """A model's request counts, sent to the device process, whose registry /metrics shows."""

    def __init__(self, link: DeviceLink, name: str, version: str) -> None:
        self._link = link
        self._key = (name, version)

    def answered(self, status: int, seconds: float, protocol: str = "http") -> None:
        self._link.tally("answered", (*self._key, status, protocol), seconds)

    def rejected(self, reason: str) -> None:
        self._link.send("rejected", (*self._key, reason))


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
        return self._service.link.submit((self.name, self.version, level), deadline,
                                         request_id.get(), items)

    async def result(self, request: RemoteRequest) -> Results:
        try:
            return await request.future
        finally:
            self._service.link.drop(request)


class RemoteRepository:
    """``get`` as ``ModelRepository.get`` resolves names, over the device's snapshot."""

    def __init__(self, service: RemoteService) -> None:
        self._service = service
        self._models: dict[tuple[str, str], RemoteModel] = {}
        self.moves = 0  # snapshots taken, each may move where names route (requests look)
        # (name, model setting, the handler sent) -> the handler made from them (None: none
        # could be), and those being made
        self._handlers: dict[HandlerKey, ModelHandler | None] = {}
        self._making: dict[HandlerKey, asyncio.Task[None]] = {}
        # What was last reported lacking (``report``); None: nothing reported yet, as the start
        # has not ended
        self._reported: Lacking | None = None
        self._lacking: Lacking = {}
        # The models ``get`` found by the (name, version) asked, while the link holds the
        # snapshot they were found in and ``update`` makes no new ones: a request's lookup
        # (``pick`` each time: 0.8 % of a front end's instructions a request on mlp)
        self._found: dict[tuple[str | None, str | None], RemoteModel] = {}
        self._found_in: Snapshot | None = None

    def get(self, name: str | None = None, version: str | None = None) -> RemoteModel:
        snap, asked = self._service.link.snapshot, (name, version)
        if snap is self._found_in:
            found = self._found.get(asked)
            if found is not None:
                return found
        else:
            self._found, self._found_in = {}, snap
        if name is None:
            if snap.default is None:
                raise NotFound(snap.default_error)
            name = snap.default
        entry = pick(name, version, snap.served.get(name), snap.current.get(name),
                     snap.failed.get(name), lambda: snap.names, name in snap.loading)
        model = self._models.get((entry.name, entry.version))
        if model is not None:
            self._found[asked] = model
            return model
        making = _key(entry) in self._making
        if making and version is None:
            # The default's handler is still being made here: a version made before serves
            # meanwhile (it drains only once this front end holds the new snapshot, whose
            # acknowledgement waits for the handler: app/bridge.py ``hold_current``).
            model = self._newest(entry.name)
        if model is None:
            if making:
                raise Unavailable("loading", f"model '{name}' is loading: this front end "
                                             "builds its handler")
            raise Unavailable("unavailable", f"model '{name}' cannot be served by this front "
                                             "end (its handler could not be built)")
        return model

    def _newest(self, name: str) -> RemoteModel | None:
        made = [m for (n, _), m in self._models.items() if n == name]
        return max(made, key=lambda m: int(m.version), default=None)

    def update(self, snap: Snapshot) -> asyncio.Future[Any] | None:
        """Models for a new snapshot, from the handlers made for it; those not made yet are
        made on threads of their own (the event loop serves on), once per model setting, the
        models following when they are; those of versions it no longer names are let go.
        Returns what is still being made (None: nothing)."""
        models = {}
        making = []
        named = set()
        lacking: Lacking = {}
        for versions in snap.served.values():
            for entry in versions.values():
                key = _key(entry)
                named.add(key)
                if key not in self._handlers:
                    making.append(self._make(key, entry))
                    lacking[(entry.name, entry.version)] = "loading"
                    continue
                handler = self._handlers[key]
                if handler is None:
                    lacking[(entry.name, entry.version)] = "unavailable"
                else:
                    models[(entry.name, entry.version)] = RemoteModel(entry, handler,
                                                                      self._service)
        self._models = models
        self._found_in = None
        self.moves += 1
        # What no snapshot names is let go: a version unloaded, a handler that failed (tried
        # again at the model's next load)
        self._handlers = {k: h for k, h in self._handlers.items() if k in named}
        self._lacking = lacking
        if self._reported is not None:
            self.report()
        return asyncio.gather(*making) if making else None

    def report(self) -> None:
        """Tell the device process which model versions this front end cannot serve, if that
        changed since it last did (the first call: whatever it is): ``loading`` while it makes
        a handler, ``unavailable`` where it could not. Its health answers say so, one answer
        whichever front end a probe reaches (app/bridge.py)."""
        if self._lacking != self._reported:
            self._reported = self._lacking
            self._service.link.send("lacking", [(*k, s) for k, s in self._lacking.items()])

    def _make(self, key: HandlerKey, entry: ModelEntry) -> asyncio.Task[None]:
        task = self._making.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._made(key, entry))
            self._making[key] = task
        return task

    async def _made(self, key: HandlerKey, entry: ModelEntry) -> None:
        # One built here (its module imported) is frozen out of the collector's reach with
        # what it made; a handler sent is a few objects.
        refreezing = (refrozen(f"model {entry.name}'s handler", asyncio.get_running_loop())
                      if entry.handler is None else contextlib.nullcontext())
        try:
            with refreezing:
                self._handlers[key] = await on_own_thread(f"build-{entry.name}", handler_for,
                                                          entry)
        finally:
            del self._making[key]
        self.update(self._service.link.snapshot)


HandlerKey = tuple[str, str, bytes | None]
Lacking = dict[tuple[str, str], str]  # (model, version) -> loading or unavailable


def _key(entry: ModelEntry) -> HandlerKey:
    return (entry.name, entry.spec, entry.handler)


class RemoteService:
    """The server as a front end's request path sees it (``app.api.inference.Serving``), and
    what ``DrainingServer`` watches: in flight, draining, and whether it must exit."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tracing = Tracing.configure(settings.otel_endpoint)  # each request's server span
        self.link = DeviceLink()
        self.repository = RemoteRepository(self)
        self.unknown = RemoteCounts(self.link, "", "")
        self.arriving = Arriving(receiving_bytes(settings))
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pool: DaemonPool | None = None

    async def start(self, inbox: Inbox, transport: asyncio.Transport) -> None:
        self.loop = asyncio.get_running_loop()
        self.pool = decode_pool()
        self.link.on_snapshot.append(self.repository.update)
        await self.link.open(inbox, transport)
        making = self.repository.update(self.link.snapshot)
        if making is not None:  # the models served at start are served here from the first,
            # unless one takes long (it reads loading here till made): the socket this front
            # end listens on is not left unanswered meanwhile
            await asyncio.wait([making], timeout=START_MAKING_S)
        self.repository.report()  # the start has ended: what it serves counts from now

    async def stop(self) -> None:
        self.link.close()
        if self.pool is not None:
            await self.pool.stop(cancel_calls=True)
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
    def starting(self) -> bool:
        """Never, once serving: the device process says what is still loading."""
        return False

    @property
    def status(self) -> str:
        if self.link.gone:
            return "unhealthy"
        return "draining" if self.draining else "ready"
