"""InferenceService: the device threads, the model repository, and the server's health.

It is the repository's runtime: it places a model version's replicas on the device threads of
its devices (loading them on loader threads first) and removes them. Every method here runs on
the event loop's thread; device threads talk back only through callbacks they schedule with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

import torch

from app.arriving import Arriving, receiving_bytes
from app.catalog import Catalog
from app.config import Settings, drain_limit_s
from app.devices import resolve_devices
from app.facade import decode_pool
from app.learning import busy_ratio, export_replica, measure_first, unexport, warm_on
from app.metrics import Metrics
from app.models.base import ModelHandler
from app.models.registry import load_handler
from app.process import refreeze_soon
from app.repository import ModelRepository
from app.served import ServedModel
from app.stall import check_not_stuck, ended_unless_stuck, unless_stuck, watch_stalls
from app.state import ModelState, ServerState, server_status
from app.tasks import Background, DaemonPool, resolver
from app.tracing import Tracing
from app.warmup import Loader
from app.worker import DeviceWorker, WorkerState

log = logging.getLogger("batchserve.service")

RESTART_DELAY_S = 1.0


def build_service(settings: Settings, handler: ModelHandler | None = None) -> InferenceService:
    """The service for ``settings``: every entry point builds it here. Nothing starts yet.

    Raises ConfigError (devices, the repository folder, load_model) or ModelLoadError (the model
    setting)."""
    devices = resolve_devices(settings.devices)
    if settings.model_repository is None and handler is None:
        handler = load_handler(settings.model, settings.model_name)
    tracing = Tracing.configure(settings.otel_endpoint)
    return InferenceService(settings, devices, Metrics.create(), Catalog(settings, handler),
                            tracing)


class InferenceService:
    """Admission happens in each ServedModel; this owns what they share. Event-loop thread only."""

    def __init__(self, settings: Settings, devices: list[torch.device], metrics: Metrics,
                 catalog: Catalog, tracing: Tracing | None = None) -> None:
        self.settings = settings
        self.devices = devices
        self.metrics = metrics
        self.tracing = tracing
        startup = catalog.startup(settings.load_model
                                  if settings.model_control_mode == "explicit" else None,
                                  settings.default_model)
        self.repository = ModelRepository(catalog, self, settings.model_control_mode, startup,
                                          settings.default_model)
        self.workers: list[DeviceWorker] = []
        self.unknown = metrics.for_model("", "")  # requests for no model the server knows
        self.arriving = Arriving(receiving_bytes(settings))
        self.state = ServerState()  # draining written here only (app/state.py)
        self.before_scrape: list[Callable[[], Awaitable[None]]] = []  # before counts are read
        self.before_retire: list[Callable[[], Awaitable[None]]] = []  # app/repository.py
        self._started = False
        self._pool: DaemonPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._startup: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None  # set when a device thread or start-up moves
        self._loaders: dict[torch.device, Loader] = {}  # per device, made at its first load
        self._background = Background(log)  # re-attaches after a restart, measurements
        self._lost: set[ServedModel] = set()  # models a restarted thread failed to take back
        self._stalls: asyncio.Task[None] | None = None  # the watch for stuck device threads

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start one device thread per device, then load the start-up models (in the
        background: health says loading meanwhile)."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        if self.settings.torch_threads:
            torch.set_num_threads(self.settings.torch_threads)
        self._pool = decode_pool()
        for index, device in enumerate(self.devices):
            label = str(device) if self.devices.count(device) == 1 else f"{device}#{index + 1}"
            self._spawn(device, label)
        self._started = True
        self._stalls = self._loop.create_task(
            watch_stalls(self.workers, self.settings.device_timeout_s, self._worker_changed))
        self._startup = self._loop.create_task(self.repository.start())
        self._startup.add_done_callback(lambda _: self._signal())

    async def changed(self) -> None:
        """Until the status may have changed: a device thread started or died, or the start-up
        models are in. Look at ``status`` just before, with no await between."""
        assert self._changed is not None
        self._changed.clear()
        await self._changed.wait()

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _spawn(self, device: torch.device, label: str) -> DeviceWorker:
        worker = DeviceWorker(device, label, self._loop, self._worker_changed)
        self.workers.append(worker)
        self.metrics.device_busy.labels(device=label).set_function(busy_ratio(worker))
        self.metrics.device_up.labels(device=label).set_function(
            lambda: worker.state is not WorkerState.FAILED and worker.clock.stuck is None)
        worker.start()
        return worker

    def _worker_changed(self, worker: DeviceWorker) -> None:
        """A device thread started, died (restarted but for a broken device), or was found
        stuck in a call or going on from one."""
        self._signal()
        self._check_stranded()
        if self.state.draining or worker.state is not WorkerState.FAILED or worker.fault:
            return
        log.error("restarting the device thread %s in %.0fs", worker.label, RESTART_DELAY_S)
        assert self._loop is not None
        self._loop.call_later(RESTART_DELAY_S, self._restart, worker)

    def _restart(self, dead: DeviceWorker) -> None:
        """A new thread for a dead one's device, serving the models the dead one served."""
        if self.state.draining or dead not in self.workers:
            return
        loaded = self.repository.models()
        held = [m for m in dead.release() if m in loaded]
        self.workers.remove(dead)
        self.metrics.device_restarts.labels(device=dead.label).inc()
        fresh = self._spawn(dead.device, dead.label)
        for model in held:
            self._background.start(self._attach(model, fresh),
                                   f"model {model.name}'s attach to the restarted {fresh.label}",
                                   failed=functools.partial(self._lose, model))

    def _lose(self, model: ServedModel) -> None:
        """A restarted thread could not take ``model`` back (``live`` says what follows)."""
        self._lost.add(model)
        self._signal()

    def begin_drain(self) -> None:
        """Refuse new work from now on (health says draining); safe from a signal handler."""
        self.state.draining = True

    async def stop(self, timeout_s: float | None = None) -> None:
        """Answer everything admitted, then stop the device threads (and send the spans still
        buffered, when tracing)."""
        self.begin_drain()
        if self._started:
            await self._stop_threads(timeout_s)
        if self._stalls is not None:
            self._stalls.cancel()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)

    async def _stop_threads(self, timeout_s: float | None) -> None:
        if self._startup is not None and not self._startup.done():
            self._startup.cancel()
        models = self.repository.models()
        for model in models:
            model.queue.shutdown()
        for worker in self.workers:
            worker.stop()
        limit = drain_limit_s(self.settings) if timeout_s is None else timeout_s
        for worker in list(self.workers):
            await ended_unless_stuck(worker, limit)
        await asyncio.sleep(0)  # let the device threads' last deliveries run
        for model in models:
            await model.queue.wait_closed()
        if self._pool is not None:
            await self._pool.stop(cancel_calls=True)
        await asyncio.gather(*(loader.close() for loader in self._loaders.values()))

    # ---- the repository's runtime ----------------------------------------------------------------

    def open(self, model: ServedModel) -> None:
        assert self._loop is not None and self._pool is not None
        model.open(self._loop, self._pool, self.tracing)

    def _share_devices(self, *also: ServedModel) -> None:
        """Tell each model (the repository's, and ``also``) which device threads serve it and
        which models share them."""
        models = list(dict.fromkeys([*self.repository.models(), *also]))
        for model in models:
            mine = [w for w in self.workers if w.holds(model)]
            model.serve_with([w.bell for w in mine],
                             [m for m in models if any(w.holds(m) for w in mine)])

    def _check_stranded(self) -> None:
        """Mark the models that no live device thread serves (after a death, a stuck call or a
        re-attach)."""
        for model in self.repository.models():
            model.set_stranded(not any(w.state is WorkerState.READY and w.clock.stuck is None
                                       and w.holds(model) for w in self.workers))

    async def place(self, model: ServedModel) -> None:
        """Load ``model``'s replicas on its devices (beside whatever serves there) and attach
        them to their device threads; returns once every device serves it, or raises the first
        failure once none holds it."""
        outcomes = await asyncio.gather(*(self._attach(model, w) for w in self.workers
                                          if w.device in model.devices), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:  # where it did attach, let it go
            await self.remove(model)
            raise failed[0]

    async def _attach(self, model: ServedModel, worker: DeviceWorker) -> None:
        check_not_stuck(worker)
        loader = self._loaders.get(worker.device)
        if loader is None:
            loader = self._loaders[worker.device] = Loader(worker.device)
        assert self._loop is not None
        warm = await warm_on(loader, model, worker.label, self._loop)
        # The thread that serves the device now: one that died meanwhile has been replaced.
        worker = next((w for w in self.workers if w.label == worker.label), worker)
        model.learn(worker.label, warm.cost, warm.work_per_item, warm.outputs, warm.batch_limit)
        attached: asyncio.Future[None] = self._loop.create_future()
        worker.attach(model, warm, resolver(attached))
        if not await unless_stuck(attached, worker):  # it would attach when the call returns:
            worker.detach(model, lambda: None)  # then let it go again
            check_not_stuck(worker)
        if model.state is ModelState.UNLOADING:  # unloaded meanwhile (a restart re-attaching)
            worker.detach(model, lambda: None)
            return
        self._share_devices(model)
        self._check_stranded()
        export_replica(self.metrics, model, worker)
        if not warm.cost.known and model.handler.measured_from_traffic:  # no examples
            model.measure_first(functools.partial(measure_first, model, self.workers,
                                                  self._loaders, self.metrics, self._background))

    async def remove(self, model: ServedModel) -> None:
        """Detach ``model`` from each device thread, which lets its replica go (stuck: later)."""
        assert self._loop is not None
        waits = {w: self._loop.create_future() for w in self.workers if w.holds(model)}
        self._lost.discard(model)
        for worker, wait in waits.items():
            worker.detach(model, resolver(wait))
        if not all(await asyncio.gather(*(unless_stuck(f, w) for w, f in waits.items()))):
            log.warning("model %s unloaded; a device thread stuck in a call holds its "
                        "replica till the call returns", model.name)
        model.serve_with([], [])
        self._share_devices()
        unexport(self.metrics, model, self.repository.models(), self.workers)
        refreeze_soon(f"model {model.name} version {model.version}'s unload", self._loop)

    # ---- state -----------------------------------------------------------------------------------

    @property
    def load_failed(self) -> bool:
        """Every model of the start-up set failed to load: nothing will ever be served."""
        return self.repository.all_failed

    @property
    def load_error(self) -> str | None:
        failed = self.repository.failed
        return "; ".join(f"{name}: {why}" for name, why in failed.items()) or None

    @property
    def in_flight(self) -> int:
        return sum(m.in_flight for m in self.repository.models())

    @property
    def live(self) -> bool:
        """No device thread is stuck in a call (app/stall.py) or has a broken device (``fault``),
        and no model that a restarted thread failed to take back is left with none to serve it."""
        return (all(w.clock.stuck is None and w.fault is None for w in self.workers)
                and not any(m.state is ModelState.READY and m.stranded for m in self._lost))

    @property
    def starting(self) -> bool:
        """Start-up is not done: the device threads, the start-up models' loads and warm-ups,
        or the front ends are still starting."""
        return (not self._started or self.repository.starting or self.state.frontends_starting
                or any(w.state is WorkerState.STARTING for w in self.workers))

    @property
    def status(self) -> str:
        """draining, unhealthy, loading, busy or ready (``server_status``)."""
        broken = (any(w.state is WorkerState.FAILED for w in self.workers) or not self.live
                  or self.repository.all_failed)
        return server_status(self.state.draining, broken, self.starting, [
            m.health for m in self.repository.models() if m.state is ModelState.READY])

