"""ModelRepository: which model versions exist, their states, and loading and unloading them.

Event-loop thread only. The runtime (the InferenceService) places a version's replicas on its
devices and removes them; the repository decides what to place and when traffic moves
(docs/models.md: rolling updates, unloading that drains).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn, Protocol

import torch

from app.catalog import Catalog, ModelSource
from app.devices import devices_among
from app.errors import BatchServeError, InvalidInput, NotFound, Unavailable, bounded
from app.metrics import Metrics
from app.models.base import ModelHandler
from app.models.registry import build_handler
from app.served import ServedModel
from app.state import STATES, ModelState, ServerState
from app.tasks import unless
from app.versions import pick

log = logging.getLogger("batchserve.models")

DRAIN_POLL_S = 0.1  # how often a load checks whether the server has begun to drain


class Runtime(Protocol):
    """What the repository needs from the service that runs the models."""

    metrics: Metrics
    state: ServerState

    devices: list[torch.device]  # the server's
    before_retire: list[Callable[[], Awaitable[None]]]  # app/bridge.py's: front ends routed

    def open(self, model: ServedModel) -> None: ...

    async def place(self, model: ServedModel) -> None: ...

    async def remove(self, model: ServedModel) -> None: ...


class ModelRepository:
    """Names -> versions -> ServedModel, which version takes a name's default traffic, and the
    reason of each model that could not be loaded."""

    def __init__(self, catalog: Catalog, runtime: Runtime, control: str,
                 startup: list[str] | None, default_model: str | None) -> None:
        self.catalog = catalog
        self.runtime = runtime
        self.control = control  # none: everything loads at start; explicit: on request
        self.startup = startup  # names to load at start (None: all)
        self.default_model = default_model
        self.served: dict[str, dict[str, ServedModel]] = {}
        self.current: dict[str, str] = {}  # name -> the version serving its default traffic
        self.failed: dict[str, str] = {}  # name -> why it could not be loaded
        self.loading: dict[str, list[ServedModel]] = {}  # name -> versions being loaded
        self.starting = True  # the start-up loads are not all done
        self.all_failed = False  # every start-up model failed (one at least): the server exits
        self.moves = 0  # how often a name's default traffic moved (the request path looks)
        self._locks: dict[str, asyncio.Lock] = {}

    # ---- start-up --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the start-up set, concurrently; a model that fails is only marked so. Where
        every one failed (one at least), nothing will be served: ``all_failed``."""
        sources = self.catalog.sources()
        names = list(sources) if self.startup is None else self.startup
        try:
            await asyncio.gather(*(self._load_quietly(sources.get(n), n) for n in names))
            self.all_failed = not self.current and bool(self.failed)
        finally:
            self.starting = False

    async def _load_quietly(self, source: ModelSource | None, name: str) -> None:
        """A start-up load, under its name's lock as any (an unload asked meanwhile waits)."""
        with contextlib.suppress(BatchServeError):  # recorded in self.failed; the others load on
            await self._locked_load(source if source is not None else self.catalog.read(name),
                                    name, reload=False)

    # ---- lookups ---------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(set(self.served) | set(self.failed) | set(self.loading))

    def get(self, name: str | None = None, version: str | None = None) -> ServedModel:
        """The model a request names (without a version: its default traffic's); NotFound where
        none is loaded. A version loading or unloading is returned: it refuses requests itself."""
        if name is None:
            name = self.default_name()
        versions = self.served.get(name)
        if not versions and self.loading.get(name):
            versions = {m.version: m for m in self.loading[name]}
        return pick(name, version, versions, self.current.get(name), self.failed.get(name),
                    self.names, loading=name in self.loading or self._starts(name))

    def _starts(self, name: str) -> bool:
        """``name`` is one the start-up loads have yet to reach (they run in a task: a request
        can come before that task has registered its first model)."""
        if not self.starting or name in self.failed:
            return False
        return name in (self.startup if self.startup is not None else self.catalog.sources())

    def default_name(self) -> str:
        """``default_model``, or the only model (checked cheaply: this runs per request)."""
        if self.default_model is not None:
            return self.default_model
        if len(self.served) == 1 and not self.loading:
            return next(iter(self.served))
        names = self.names()
        if len(names) == 1:
            return names[0]
        if not names and self.starting:
            raise Unavailable("loading", "the server is loading its models")
        raise NotFound(f"this server serves {names or 'no model'}: name one "
                       "(POST /models/NAME/predict), or start it with --default-model")

    def models(self) -> list[ServedModel]:
        """Every version loaded, loading or unloading."""
        loading = [m for models in self.loading.values() for m in models]
        return [m for versions in self.served.values() for m in versions.values()] + loading

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: every model of the catalog with its state, and any
        still loaded whose folder has gone since (it serves till unloaded)."""
        entries = []
        sources = self.catalog.sources()
        loaded = self.models()
        for name in sorted(set(sources) | {m.name for m in loaded}):
            versions = [m for m in loaded if m.name == name]
            for model in sorted(versions, key=lambda m: int(m.version)):
                entries.append({"name": name, "version": model.version,
                                "state": model.state.value, "reason": model.reason})
            if not versions and name in self.loading:  # its code is being built
                entries.append({"name": name, "version": "", "state": "LOADING", "reason": ""})
            elif not versions:
                reason = self.failed.get(name) or sources[name].reason or "unloaded"
                entries.append({"name": name, "version": "", "state": "UNAVAILABLE",
                                "reason": reason})
        if ready_only:
            entries = [e for e in entries if e["state"] == ModelState.READY.value]
        return entries

    # ---- load and unload -------------------------------------------------------------------------

    async def load(self, name: str, config: dict[str, Any] | None = None) -> None:
        """Load ``name`` (or reload it: a new version, or ``config``), answering once it is ready.
        Raises InvalidInput (a 400) saying why it could not."""
        if self.control != "explicit":
            raise InvalidInput("explicit model load and unload are not allowed: the server runs "
                               "with --model-control-mode none")
        if config is not None and "model" in config:  # it would import and call what it names
            raise InvalidInput(f"failed to load '{name}': a load's config cannot set 'model'; "
                               "a model's code and weights come from the repository (its "
                               "folder and config.toml, or the model setting), not a request")
        source = self.catalog.read(name, config)
        if source.missing:  # nothing of that name: neither a lock nor a failure kept for it
            raise InvalidInput(f"failed to load '{name}': {source.reason}")
        await self._until_drain(self._locked_load(source, name, config is not None),
                                f"the load of '{name}'")

    async def _locked_load(self, source: ModelSource, name: str, reload: bool) -> None:
        async with self._lock(name):
            await self._load(source, name, reload)

    async def _until_drain(self, work: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``work`` (a load or an unload) unless the server drains first, or meanwhile:
        then it is abandoned and 503 draining raised at once, the process about to exit, not
        after the drain's limit or never (a load may hang; an unload waits for a load)."""
        if not await unless(work, lambda: self.runtime.state.draining, DRAIN_POLL_S):
            raise Unavailable("draining", f"the server is shutting down: {what} was abandoned")

    async def unload(self, name: str) -> None:
        """Unload every version of ``name``: new requests are refused at once, the admitted ones
        are answered, then its replicas are released. Answers when that is done."""
        if self.control != "explicit":
            raise InvalidInput("explicit model load and unload are not allowed: the server runs "
                               "with --model-control-mode none")
        if name not in self._locks and name not in self.served and name not in self.failed:
            return  # nothing of that name: no lock kept for it (a client may send any name)
        await self._until_drain(self._locked_unload(name), f"the unload of '{name}'")

    async def _locked_unload(self, name: str) -> None:
        async with self._lock(name):
            self.failed.pop(name, None)
            self.current.pop(name, None)
            self.moves += 1
            await asyncio.gather(*(self._retire(m) for m in self.served.get(name, {}).values()))

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _load(self, source: ModelSource, name: str, reload: bool = False) -> None:
        """Load the versions ``source`` wants that are not ready (all of them for a reload)
        beside what serves now; once every one is ready, move the name's default traffic to the
        newest and, once every front end routes by that (``before_retire``: what it routed by
        the versions before is queued there by then), retire what they replace."""
        if source.reason:
            self._failed(name, source.reason)
        wanted = source.wanted()
        before = list(self.served.get(name, {}).values())
        ready = {m.version for m in before if m.state is ModelState.READY}
        fresh = [v for v in wanted if reload or v not in ready]
        # What nothing serves reads LOADING from here (a reload's version serves on meanwhile).
        new = [v for v in fresh if v not in self.served.get(name, {})]
        self._publish(name, new, ModelState.LOADING)
        started: list[ServedModel] = []
        self.loading[name] = started  # a request for it is told it loads, its code built first
        try:
            handlers = [source.handler or await build_handler(source.versions[version], name)
                        for version in fresh]
            for version, handler in zip(fresh, handlers, strict=True):
                started.append(self._start_version(source, name, version, handler))
            await asyncio.gather(*(self.runtime.place(m) for m in started))
        except Exception as exc:  # noqa: BLE001 - whatever loading the model raised
            for model in started:
                self._discard(model)
            self._publish(name, new, ModelState.UNAVAILABLE)  # those whose code never built too
            self._failed(name, _reason(exc))
        finally:
            del self.loading[name]
        versions = self.served.setdefault(name, {})
        superseded = [m for m in before if m.version not in wanted or m.version in fresh]
        for model in started:
            model.set_state(ModelState.READY)
            versions[model.version] = model
        self.failed.pop(name, None)
        self.current[name] = max(wanted, key=int)  # default traffic moves, in one assignment
        self.moves += 1
        log.info("model %s: serving version %s", name, self.current[name])
        if superseded:  # they drain once the front ends route past them
            await asyncio.gather(*(routed() for routed in self.runtime.before_retire))
        await asyncio.gather(*(self._retire(m) for m in superseded))

    def _start_version(self, source: ModelSource, name: str, version: str,
                       handler: ModelHandler) -> ServedModel:
        """A ServedModel for one version, LOADING: requests that reach it are told so. What
        cannot be loaded raises (``_load`` records it)."""
        settings = source.settings
        assert settings is not None
        devices = devices_among(settings.devices, self.runtime.devices)
        model = ServedModel(name, version, settings, handler, devices,
                            self.runtime.metrics.for_model(name, version),
                            source.versions.get(version, ""), self.runtime.state)
        self.runtime.open(model)
        return model

    def _publish(self, name: str, versions: list[str], state: ModelState) -> None:
        """``state`` in the state metric of ``name``'s ``versions``."""
        for version in versions:
            self.runtime.metrics.for_model(name, version).state(state.value, STATES)

    def _replaced(self, model: ServedModel) -> bool:
        """Another object now serves ``model``'s name and version (a reload of that version)."""
        current = self.served.get(model.name, {}).get(model.version)
        return current is not None and current is not model

    def _discard(self, model: ServedModel) -> None:
        """``model`` is let go (unloaded, or its load failed). Where nothing else serves its
        version, the version's state metric reads UNAVAILABLE (as the index says) and its
        gauges that read it go."""
        model.queue.shutdown()
        if not self._replaced(model):
            model.metrics.state(ModelState.UNAVAILABLE.value, STATES)
            self.runtime.metrics.forget_model(model.name, model.version)

    def _failed(self, name: str, reason: str) -> NoReturn:
        """Record why ``name`` cannot be loaded and raise it as a 400. The reason may quote a
        load's config, a client's: bounded in the index, health and the log as in the answer."""
        reason = bounded(reason)
        self.failed[name] = reason
        log.error("model %s failed to load: %s", name, reason)
        raise InvalidInput(f"failed to load '{name}': {reason}")

    async def _retire(self, model: ServedModel) -> None:
        """Refuse new requests, answer the admitted ones, release the replicas, forget it."""
        model.set_state(ModelState.UNLOADING, publish=not self._replaced(model))
        await model.settled()  # what is still queued belongs to requests nobody waits for
        await self.runtime.remove(model)
        versions = self.served.get(model.name, {})
        if versions.get(model.version) is model:
            del versions[model.version]
        if not versions:
            self.served.pop(model.name, None)
        self._discard(model)
        log.info("model %s version %s unloaded", model.name, model.version)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, BatchServeError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
