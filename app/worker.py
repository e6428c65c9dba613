"""DeviceWorker: one thread, one device, one model replica, draining the shared queue."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import janus
import torch

from app.batching import (
    ArrivalRate,
    BatchPolicy,
    PendingItem,
    SyncGetter,
    collect_batch,
    group_by,
    split_live,
)
from app.errors import DeadlineExceeded, ModelError
from app.models.base import ModelHandler, OutputCountMismatch, Replica, map_tensors

log = logging.getLogger("batchserve.worker")


class WorkerState(Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass
class BatchReport:
    """What one pass of the loop did, handed to the event loop with the results."""

    device: str
    results: list[tuple[PendingItem, Any]]  # a result, or a ServeError for that item
    started_at: float
    sizes: list[int] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    expired: int = 0
    cancelled: int = 0


Deliver = Callable[[BatchReport], None]


class DeviceWorker:
    """Runs the model for one device on its own thread.

    ``start``/``join`` are called from the event loop's thread; everything else in this class runs
    on the worker thread. Results go back through ``deliver``, which the worker schedules on the
    loop with one ``call_soon_threadsafe`` per batch. ``on_state`` is scheduled the same way when
    the thread ends for any reason other than the queue shutting down.
    """

    def __init__(
        self,
        device: torch.device,
        handler: ModelHandler,
        queue: SyncGetter,
        policy: BatchPolicy,
        loop: Any,
        deliver: Deliver,
        in_flight: Callable[[], int],
        on_state: Callable[[DeviceWorker], None],
    ) -> None:
        self.device = device
        self.handler = handler
        self._queue = queue
        self._policy = policy
        self._loop = loop
        self._deliver = deliver
        self._in_flight = in_flight
        self._on_state = on_state
        limit = policy.max_batch_size
        if handler.max_batch_size is not None:
            limit = min(limit, handler.max_batch_size)
        self.batch_limit = limit
        self.state = WorkerState.LOADING
        self.error: str | None = None
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._main, name=f"device-{device}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- worker thread -------------------------------------------------------------------------

    def _main(self) -> None:
        in_hand: list[PendingItem] = []
        try:
            replica = self._load()
        except BaseException as exc:  # noqa: BLE001
            self._fail(f"load: {type(exc).__name__}: {exc}")
            return
        try:
            self.state = WorkerState.READY
            log.info("device %s ready (batch limit %d)", self.device, self.batch_limit)
            self._loop.call_soon_threadsafe(self._on_state, self)
            rate = ArrivalRate()
            while True:
                in_hand = collect_batch(
                    self._queue, self._policy, self.batch_limit, rate, self._in_flight
                )
                self._process(replica, in_hand)
                in_hand = []
        except janus.SyncQueueShutDown:
            self.state = WorkerState.STOPPED
            return
        except BaseException as exc:  # noqa: BLE001 - a dying thread must never be silent
            if in_hand:
                self._send(BatchReport(str(self.device), [(i, ModelError()) for i in in_hand], 0.0))
            self._fail(f"{type(exc).__name__}: {exc}")

    def _fail(self, error: str) -> None:
        self.state = WorkerState.FAILED
        self.error = error
        log.critical("device thread %s died: %s", self.device, error, exc_info=True)
        self._loop.call_soon_threadsafe(self._on_state, self)

    def _load(self) -> Replica:
        with torch.inference_mode():
            replica = self.handler.load(self.device)
            examples = self.handler.examples()
            if examples:
                items = self.handler.decode(examples)
                for group in group_by(items, self.handler.key):
                    self._infer(replica, group)
        return replica

    def _process(self, replica: Replica, batch: list[PendingItem]) -> None:
        started = time.monotonic()
        live, dead = split_live(batch, started)
        report = BatchReport(str(self.device), [], started)
        for item in dead:
            if item.request.future.done():
                report.cancelled += 1
            else:
                report.expired += 1
                report.results.append((item, DeadlineExceeded("deadline passed while queued")))
        for group in group_by(live, lambda i: i.key):
            self._run_group(replica, group, report)
        self._send(report)

    def _run_group(self, replica: Replica, items: list[PendingItem], report: BatchReport) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self._infer(replica, [i.data for i in items])
        except torch.OutOfMemoryError:
            if len(items) == 1:
                log.error("device %s: out of memory on a single item", self.device)
                report.results.append((items[0], ModelError(
                    "the model ran out of device memory on this item alone"
                )))
                return
            half = len(items) // 2
            if half < self.batch_limit:
                self.batch_limit = half
                log.warning("device %s: out of memory at batch %d; batch limit lowered to %d",
                            self.device, len(items), half)
            self._run_group(replica, items[:half], report)
            self._run_group(replica, items[half:], report)
            return
        except Exception:
            log.exception("device %s: model failed on a batch of %d", self.device, len(items))
            report.results.extend((i, ModelError()) for i in items)
            return
        elapsed = time.perf_counter() - t0
        self.busy_s += elapsed
        report.sizes.append(len(items))
        report.compute_s.append(elapsed)
        report.results.extend(zip(items, outputs, strict=True))

    def _infer(self, replica: Replica, data: list[Any]) -> list[Any]:
        handler, device = self.handler, self.device
        with torch.inference_mode():
            batch = handler.collate(data)
            if device.type != "cpu":
                batch = map_tensors(lambda t: t.pin_memory().to(device, non_blocking=True), batch)
            outputs = replica(batch)
            if device.type != "cpu":
                outputs = map_tensors(lambda t: t.to("cpu"), outputs)
            results = handler.split(outputs, len(data))
        if len(results) != len(data):
            raise OutputCountMismatch(
                f"handler returned {len(results)} results for {len(data)} items"
            )
        return results

    def _send(self, report: BatchReport) -> None:
        self._loop.call_soon_threadsafe(self._deliver, report)
