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
    take_queued,
)
from app.errors import DeadlineExceeded, ModelError
from app.models.base import ModelHandler, Replica
from app.models.signature import TensorSpec, describe_outputs
from app.transfer import DeviceExecutor, Launch

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


@dataclass
class InFlight:
    """A batch whose model calls were launched: one (items, launch) per key group."""

    report: BatchReport
    groups: list[tuple[list[PendingItem], Launch]] = field(default_factory=list)

    @property
    def pending(self) -> bool:
        return any(launch.pending for _, launch in self.groups)

    def items(self) -> list[PendingItem]:
        return [item for items, _ in self.groups for item in items]


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
        self.batch_limit = policy.max_batch_size  # lowered after an out-of-memory
        self.state = WorkerState.LOADING
        self.error: str | None = None  # why the thread died
        self.load_failed = False  # it died loading the model: a retry would fail the same way
        self.outputs: list[TensorSpec] | None = None  # learned from the warm-up results
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._main, name=f"device-{device}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- worker thread -------------------------------------------------------------------------

    def _main(self) -> None:
        """Collect, launch, complete. On CUDA one batch stays in flight while the next is
        collected and launched (app/transfer.py); on the CPU each batch completes at once."""
        flights: list[InFlight] = []  # launched, not yet completed: at most one left pending
        in_hand: list[PendingItem] = []
        try:
            executor = DeviceExecutor(self.device, self.handler)
            replica = self._load(executor)
        except BaseException as exc:  # noqa: BLE001
            self.load_failed = True
            self._fail(f"{type(exc).__name__}: {exc}", loading=True)
            return
        try:
            self.state = WorkerState.READY
            log.info("device %s ready (batch limit %d)", self.device, self.batch_limit)
            self._loop.call_soon_threadsafe(self._on_state, self)
            rate = ArrivalRate()
            while True:
                if not flights:
                    in_hand = collect_batch(
                        self._queue, self._policy, self.batch_limit, rate, self._in_flight
                    )
                else:  # the device is busy: take what is queued, or finish the batch in flight
                    in_hand = take_queued(self._queue, self.batch_limit)
                    if not in_hand:
                        self._complete(flights[0])
                        flights.pop(0)
                        continue
                flights.append(self._launch(executor, replica, in_hand))
                in_hand = []
                while flights and (len(flights) > 1 or not flights[0].pending):
                    self._complete(flights[0])
                    flights.pop(0)
        except janus.SyncQueueShutDown:
            for flight in flights:
                self._complete(flight)
            self.state = WorkerState.STOPPED
            return
        except BaseException as exc:  # noqa: BLE001 - a dying thread must never be silent
            lost = in_hand + [item for flight in flights for item in flight.items()]
            if lost:
                self._send(BatchReport(str(self.device), [(i, ModelError()) for i in lost], 0.0))
            self._fail(f"{type(exc).__name__}: {exc}")

    def _fail(self, error: str, loading: bool = False) -> None:
        """Record why the thread dies and tell the service. A model that cannot load is one
        line (its traceback at debug level); a crash while serving is a bug: full traceback."""
        self.state = WorkerState.FAILED
        self.error = error
        if loading:
            log.error("device %s: the model failed to load: %s", self.device, error)
            log.debug("model load traceback", exc_info=True)
        else:
            log.critical("device thread %s died: %s", self.device, error, exc_info=True)
        self._loop.call_soon_threadsafe(self._on_state, self)

    def _load(self, executor: DeviceExecutor) -> Replica:
        """Load the replica and run the handler's examples through it (warm-up), recording
        what its outputs look like."""
        with torch.inference_mode():
            replica = self.handler.load(self.device)
            examples = self.handler.examples()
            if examples:
                results: list[Any] = []
                for group in group_by(self.handler.decode(examples), self.handler.key):
                    results += executor.launch(replica, group).wait()[0]
                self.outputs = describe_outputs(results)
        return replica

    def _launch(
        self, executor: DeviceExecutor, replica: Replica, batch: list[PendingItem]
    ) -> InFlight:
        started = time.monotonic()
        live, dead = split_live(batch, started)
        flight = InFlight(BatchReport(str(self.device), [], started))
        report = flight.report
        for item in dead:
            if item.request.deadline <= started:  # its future may already hold the timeout
                report.expired += 1
                report.results.append((item, DeadlineExceeded("deadline passed while queued")))
            else:
                report.cancelled += 1
        for group in group_by(live, lambda i: i.key):
            self._launch_group(executor, replica, group, flight)
        return flight

    def _launch_group(
        self, executor: DeviceExecutor, replica: Replica, items: list[PendingItem],
        flight: InFlight,
    ) -> None:
        report = flight.report
        try:
            launch = executor.launch(replica, [i.data for i in items])
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
            self._launch_group(executor, replica, items[:half], flight)
            self._launch_group(executor, replica, items[half:], flight)
            return
        except Exception:
            self._model_failed(items, report)
            return
        flight.groups.append((items, launch))

    def _complete(self, flight: InFlight) -> None:
        """Wait for the batch's device work, split the outputs and send every result."""
        report = flight.report
        for items, launch in flight.groups:
            try:
                outputs, seconds = launch.wait()
            except Exception:
                self._model_failed(items, report)
                continue
            self.busy_s += seconds
            report.sizes.append(len(items))
            report.compute_s.append(seconds)
            report.results.extend(zip(items, outputs, strict=True))
        self._send(report)

    def _model_failed(self, items: list[PendingItem], report: BatchReport) -> None:
        """The model raised on these items (at launch or while waiting): log it, fail them."""
        log.exception("device %s: model failed on a batch of %d", self.device, len(items))
        report.results.extend((i, ModelError()) for i in items)

    def _send(self, report: BatchReport) -> None:
        self._loop.call_soon_threadsafe(self._deliver, report)
