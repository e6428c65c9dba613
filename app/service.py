"""InferenceService: owns the bounded janus queue and the device workers.

Every method here runs on the event loop's thread; the workers talk back only through callbacks
they schedule with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import janus
import torch

from app.batching import BatchPolicy, PendingItem, PendingRequest
from app.config import Settings
from app.devices import resolve_devices
from app.errors import DeadlineExceeded, ServeError, Unavailable, busy
from app.metrics import Metrics
from app.models.base import ModelHandler
from app.models.registry import load_handler
from app.models.signature import INPUT_NAME, OUTPUT_NAME, TensorSpec
from app.worker import BatchReport, DeviceWorker, WorkerState

log = logging.getLogger("batchserve.service")

RESTART_DELAY_S = 1.0
INLINE_DECODE_MAX_ITEMS = 64  # light decodes of small requests stay on the loop


def build_service(settings: Settings, handler: ModelHandler | None = None) -> InferenceService:
    """The service for ``settings``: every entry point builds it here. Nothing starts yet.

    Raises ConfigError (devices) or ModelLoadError (the model setting)."""
    devices = resolve_devices(settings.devices)
    if handler is None:
        handler = load_handler(settings.model, settings.model_name)
    return InferenceService(settings, handler, Metrics.create(), devices)


class InferenceService:
    """Admission, the queue and the workers' lifecycle. Event-loop thread only."""

    def __init__(
        self,
        settings: Settings,
        handler: ModelHandler,
        metrics: Metrics,
        devices: list[torch.device],
    ) -> None:
        self.settings = settings
        self.handler = handler
        self.metrics = metrics
        self.devices = devices
        self.policy = BatchPolicy(self.batch_limit, settings.max_wait_s)
        self.in_flight = 0
        self.workers: list[DeviceWorker] = []
        self._draining = False
        self._queue: janus.Queue[PendingItem] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the queue on the running loop and start one worker per device (they load)."""
        self._loop = asyncio.get_running_loop()
        if self.settings.torch_threads:
            torch.set_num_threads(self.settings.torch_threads)
        self._queue = janus.Queue(maxsize=self.settings.queue_capacity)
        self._pool = ThreadPoolExecutor(
            max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="decode"
        )
        queue = self._queue
        self.metrics.queue_depth.set_function(lambda: queue.async_q.qsize())
        self.metrics.in_flight.set_function(lambda: self.in_flight)
        for device in self.devices:
            self._spawn(device)

    def _spawn(self, device: torch.device) -> DeviceWorker:
        assert self._queue is not None
        worker = DeviceWorker(
            device, self.handler, self._queue.sync_q, self.policy, self._loop,
            self._deliver, lambda: self.in_flight, self._worker_changed,
        )
        self.workers.append(worker)
        label = str(device) if self.devices.count(device) == 1 else f"{device}#{len(self.workers)}"
        self.metrics.device_busy.labels(device=label).set_function(_busy_ratio(worker))
        self.metrics.batch_limit.labels(device=label).set_function(lambda: worker.batch_limit)
        worker.start()
        return worker

    def _worker_changed(self, worker: DeviceWorker) -> None:
        if self._draining or worker.state is not WorkerState.FAILED:
            return
        if worker.load_failed:
            return  # a model that cannot load will not load on retry; health stays unhealthy
        log.error("restarting the device thread for %s in %.0fs", worker.device, RESTART_DELAY_S)
        assert self._loop is not None
        self._loop.call_later(RESTART_DELAY_S, self._restart, worker)

    def _restart(self, dead: DeviceWorker) -> None:
        if self._draining or dead not in self.workers:
            return
        self.workers.remove(dead)
        self._spawn(dead.device)

    def begin_drain(self) -> None:
        """Refuse new work from now on (health says draining); safe from a signal handler."""
        self._draining = True

    async def stop(self, timeout_s: float | None = None) -> None:
        """Answer everything accepted, then stop the workers and close the queue."""
        self._draining = True
        if self._queue is None:
            return
        self._queue.shutdown()  # workers finish what is queued, then their get() raises
        limit = self.settings.request_timeout_s + 5.0 if timeout_s is None else timeout_s
        for worker in list(self.workers):
            if not await asyncio.to_thread(worker.join, limit):
                log.error("device thread %s did not stop within %.0fs", worker.device, limit)
        self._fail_leftovers()
        await asyncio.sleep(0)  # let the workers' last deliveries run
        await self._queue.wait_closed()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _fail_leftovers(self) -> None:
        assert self._queue is not None
        leftovers = BatchReport("none", [], time.monotonic())
        while True:
            try:
                item = self._queue.sync_q.get_nowait()
            except Exception:  # empty, or shut down and empty
                break
            leftovers.results.append((item, Unavailable("draining", "the server shut down")))
        if leftovers.results:
            self._deliver(leftovers)

    # ---- state ---------------------------------------------------------------------------------

    @property
    def load_failed(self) -> bool:
        """A device thread could not load the model (it is not retried)."""
        return any(w.load_failed for w in self.workers)

    @property
    def load_error(self) -> str | None:
        """Why the model failed to load, if it did."""
        return next((w.error for w in self.workers if w.load_failed), None)

    @property
    def batch_limit(self) -> int:
        """The most items in one model call: the setting, or less where the model says so."""
        limit = self.settings.max_batch_size
        if self.handler.max_batch_size is not None:
            limit = min(limit, self.handler.max_batch_size)
        return limit

    @property
    def input_spec(self) -> TensorSpec:
        handler = self.handler
        return TensorSpec(INPUT_NAME, handler.input_datatype, handler.input_shape)

    @property
    def outputs(self) -> list[TensorSpec] | None:
        """The model's outputs as its warm-up produced them; before that (or without examples)
        the one output the handler declares, or None when nothing is known."""
        for worker in self.workers:
            if worker.outputs:
                return worker.outputs
        if self.handler.output_shape is None:
            return None
        return [TensorSpec(OUTPUT_NAME, "FP32", self.handler.output_shape)]

    @property
    def queue_depth(self) -> int:
        return self._queue.async_q.qsize() if self._queue is not None else 0

    @property
    def status(self) -> str:
        """draining, unhealthy (a device thread failed), loading, busy or ready."""
        states = {w.state for w in self.workers}
        if self._draining:
            return "draining"
        if self._queue is None:
            return "loading"
        if WorkerState.FAILED in states:
            return "unhealthy"
        if WorkerState.LOADING in states:
            return "loading"
        if self.queue_depth >= self.settings.queue_capacity:
            return "busy"
        return "ready"

    def check_admissible(self, n: int) -> None:
        """Raise Unavailable unless a request of ``n`` items can be queued whole right now."""
        if self._draining:
            raise Unavailable("draining", "the server is shutting down")
        if not any(w.state is WorkerState.READY for w in self.workers):
            state = "unhealthy" if self.status == "unhealthy" else "loading"
            raise Unavailable(state, f"the model is not ready ({state})")
        if self.queue_depth + n > self.settings.queue_capacity:
            raise busy(self.settings.queue_capacity)

    # ---- the request path ------------------------------------------------------------------------

    async def decode(self, instances: list[Any]) -> list[Any]:
        """Validate and pre-process; heavy or large decodes run in the bounded decode pool."""
        if not self.handler.heavy_decode and len(instances) <= INLINE_DECODE_MAX_ITEMS:
            return self.handler.decode(instances)
        assert self._loop is not None
        return await self._loop.run_in_executor(self._pool, self.handler.decode, instances)

    def enqueue(self, items: list[Any], deadline: float) -> PendingRequest:
        """Admit a request whole or refuse it whole (Unavailable). Never waits.

        From here the request's future resolves exactly once: to its results, to an error, or to
        DeadlineExceeded when its deadline passes first (one timer, cancelled in ``result``).
        """
        self.check_admissible(len(items))
        assert self._queue is not None and self._loop is not None
        now = time.monotonic()
        request = PendingRequest(self._loop.create_future(), len(items), deadline, now)
        key = self.handler.key
        put = self._queue.async_q.put_nowait
        # Only this thread puts, and workers only take, so the capacity check above guarantees
        # every put below succeeds: a request is never partly queued.
        for index, data in enumerate(items):
            put(PendingItem(request, index, data, key(data)))
        self.in_flight += 1
        request.timer = self._loop.call_later(deadline - now, _expire, request.future)
        return request

    async def result(self, request: PendingRequest) -> list[Any]:
        """Wait for a request's results (DeadlineExceeded once its deadline passes)."""
        try:
            return await request.future
        finally:
            self.in_flight -= 1
            if request.timer is not None:
                request.timer.cancel()
            if not request.future.done():
                request.future.cancel()  # drop its queued items before they reach the device

    def _deliver(self, report: BatchReport) -> None:
        """Resolve futures from one batch (scheduled by a worker on the loop)."""
        m = self.metrics
        for item, value in report.results:
            request = item.request
            future = request.future
            if future.done():
                continue
            if isinstance(value, ServeError):
                future.set_exception(value)
                continue
            request.results[item.index] = value
            request.remaining -= 1
            if request.remaining == 0:
                future.set_result(request.results)
            m.queue_wait.observe(report.started_at - request.enqueued_at)
        for size, seconds in zip(report.sizes, report.compute_s, strict=True):
            m.batch_size.observe(size)
            m.batch_compute.observe(seconds)
        if report.expired:
            m.dropped.labels(reason="expired").inc(report.expired)
        if report.cancelled:
            m.dropped.labels(reason="cancelled").inc(report.cancelled)


def _expire(future: asyncio.Future[list[Any]]) -> None:
    if not future.done():
        future.set_exception(
            DeadlineExceeded("the request's deadline passed before it was answered")
        )


def _busy_ratio(worker: DeviceWorker) -> Any:
    """A gauge callback: share of wall time spent computing since the previous scrape."""
    last = {"busy": worker.busy_s, "at": time.monotonic()}

    def ratio() -> float:
        now, busy_s = time.monotonic(), worker.busy_s
        elapsed = now - last["at"]
        value = (busy_s - last["busy"]) / elapsed if elapsed > 0 else 0.0
        last.update(busy=busy_s, at=now)
        return min(1.0, max(0.0, value))

    return ratio
