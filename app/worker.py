"""DeviceWorker: one thread per device, serving every model placed on it (docs/models.md).

It chooses whose batch runs next (app/scheduler/fairness.py), collects that batch from where
the model's slot says (app/slot.py), launches it, and hands the results to the model on the
event loop. Replicas arrive loaded and measured (app/warmup.py). On CUDA one batch stays in
flight while the next is collected and launched (app/transfer.py), whichever models they are of.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

from app.bell import Bell, Mailbox
from app.devices import THREAD_PREFIX, DeviceFault, device_fault
from app.errors import DeadlineExceeded, ModelError
from app.failures import after_failure, log_apart, log_failure
from app.models.base import Replica
from app.pending import DROPPED, PendingItem, rows_in
from app.report import BatchReport, per_item
from app.scheduler.fairness import Fairness
from app.scheduler.waiting import collect_batch, group_by, split_live
from app.served import ServedModel
from app.slot import Launched, Slot
from app.stall import CallClock
from app.transfer import DeviceExecutor
from app.warmup import Warm

log = logging.getLogger("batchserve.worker")

IDLE_S = 1.0  # longest sleep with no work; any put, command or stop rings the bell sooner


class WorkerState(Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class DeviceWorker:
    """Runs the models placed on one device, on its own thread.

    ``start``, ``join``, ``attach``, ``detach``, ``stop``, ``holds`` and the ``bell``
    (app/bell.py) may be used from any thread; everything else runs on the worker thread. Each
    batch's results go to its model's ``deliver`` with one ``call_soon_threadsafe``;
    ``on_state`` is scheduled the same way when the thread is ready and when it dies.
    """

    def __init__(self, device: torch.device, label: str, loop: Any,
                 on_state: Callable[[DeviceWorker], None]) -> None:
        self.device = device
        self.label = label  # its name in metrics and logs (cpu, cuda:0, cpu#2)
        self._loop = loop
        self._on_state = on_state
        self.state = WorkerState.STARTING
        self.error: str | None = None  # why the thread died
        self.fault: str | None = None  # why its device can no longer be used (not restarted)
        self.busy_s = 0.0
        self.clock = CallClock()  # its model calls, for the loop to see one stuck (app/stall.py)
        self._slots: dict[ServedModel, Slot] = {}
        self.bell = Bell()
        self._commands = Mailbox(self.bell)
        self._stopping = False
        self._fairness: Fairness[ServedModel] = Fairness()
        self._thread = threading.Thread(target=self._run, name=THREAD_PREFIX + label, daemon=True)

    # ---- any thread ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def attach(self, model: ServedModel, warm: Warm, done: Callable[[], None]) -> None:
        """Serve ``model`` with a warmed replica from the next batch on; ``done`` runs on the
        loop."""
        def run() -> None:
            self._slots[model] = Slot(model, warm.replica, warm.batch_limit, warm.cost,
                                      warm.padded)

        self._commands.give(run, functools.partial(self._loop.call_soon_threadsafe, done))

    def detach(self, model: ServedModel, done: Callable[[], None]) -> None:
        """Stop serving ``model`` and release its replica; ``done`` runs on the loop, once the
        thread holds nothing of the model (the caller may find it collected at once)."""
        def run() -> None:
            self._slots.pop(model, None)
            self._fairness.forget(model)
            if self.device.type == "cuda" and self.fault is None:
                torch.cuda.empty_cache()  # the replica's blocks go back to the driver

        self._commands.give(run, functools.partial(self._loop.call_soon_threadsafe, done))

    def release(self) -> list[ServedModel]:
        """A dead thread lets its replicas go (the thread that replaces it loads its own) and
        says whose they were."""
        held = list(self._slots)
        self._slots.clear()
        return held

    def holds(self, model: ServedModel) -> bool:
        return model in self._slots

    def replica_of(self, model: ServedModel) -> Replica | None:
        slot = self._slots.get(model)
        return slot.replica if slot is not None else None

    def batch_limit(self, model: ServedModel) -> int:
        slot = self._slots.get(model)
        return slot.batch_limit if slot is not None else model.batch_limit

    def stop(self) -> None:
        """Finish every queued item and every batch in flight, then end the thread."""
        self._stopping = True
        self.bell.ring_now()

    # ---- worker thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._main()
        finally:
            self._commands.close()

    def _main(self) -> None:
        flights: list[Launched] = []  # launched, not yet completed: at most one left pending
        in_hand: list[PendingItem] = []
        slot: Slot | None = None
        try:
            executor = DeviceExecutor(self.device)
        except BaseException as exc:  # noqa: BLE001 - a device that cannot be used
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        self.state = WorkerState.READY
        self._loop.call_soon_threadsafe(self._on_state, self)
        try:
            while True:
                if self.fault is not None:  # what was launched fails too, and is answered
                    while flights:
                        self._complete(flights.pop(0))
                    raise DeviceFault(self.fault)
                self._commands.run_all()
                slot = self._choose()
                if slot is None:
                    if flights:
                        self._settle(flights)
                    elif self._stopping:
                        break
                    else:
                        self.bell.sleep(IDLE_S, self._idle)
                    continue
                source = slot.source()
                if flights:  # the device is busy: take what is queued, no waiting
                    in_hand = source.take(slot.batch_limit)
                    for item in in_hand:
                        slot.rate.observe(item.request)
                else:
                    in_hand = collect_batch(
                        source, slot.model.policy, slot.batch_limit, slot.rate,
                        slot.model.concurrency, slot.pricing, slot.model.settings.latency_target_s,
                        nap=functools.partial(self._fill, slot.model))
                if not in_hand:
                    continue
                flights.append(self._launch(executor, slot, in_hand))
                in_hand = []
                while flights and (len(flights) > 1 or not flights[0].pending):
                    self._complete(flights.pop(0))
            self.state = WorkerState.STOPPED
        except BaseException as exc:  # noqa: BLE001 - a dying thread must never be silent
            # The death is reported before the lost items' answers, so a client that retries
            # on its 500 already finds the model marked as served by no live thread.
            self._fail(f"{type(exc).__name__}: {exc}")
            lost = [(flight.slot, flight.items()) for flight in flights]
            if slot is not None and in_hand:
                lost.append((slot, in_hand))
            for held, items in lost:  # every item held gets its answer
                report = BatchReport(self.label, [(item, ModelError()) for item in items], 0.0)
                self._loop.call_soon_threadsafe(held.model.deliver, report)

    def _choose(self) -> Slot | None:
        """The model whose batch runs next, or None when no model has anything waiting."""
        candidates = []
        for model, slot in self._slots.items():
            head = slot.model.queue.head()
            if head is not None:
                candidates.append((model, head.request.earliest))
        return self._slots[self._fairness.pick(candidates)] if candidates else None

    def _idle(self) -> bool:
        """Nothing queued for any model here, no command, no stop: the thread may sleep."""
        waiting = any(s.model.queue.head() is not None for s in self._slots.values())
        return not (waiting or self._commands or self._stopping)

    def _fill(self, model: ServedModel, seconds: float, more: int) -> None:
        """While a batch of ``model`` fills: sleep until ``more`` items have joined its queue
        or ``seconds`` are up."""
        ring_at = model.queue.depth + more
        self.bell.sleep(seconds, lambda: model.queue.depth < ring_at, model, ring_at)

    def _fail(self, error: str) -> None:
        self.state = WorkerState.FAILED
        self.error = error
        if self.fault is not None:
            log.critical("device %s can no longer be used (%s): its models are refused and "
                         "/v2/health/live 503, for the orchestrator to restart the server",
                         self.label, self.fault)
        else:
            log.critical("device thread %s died: %s", self.label, error, exc_info=True)
        self._loop.call_soon_threadsafe(self._on_state, self)

    def _launch(self, executor: DeviceExecutor, slot: Slot, batch: list[PendingItem]
                ) -> Launched:
        started = time.monotonic()
        live, expired, cancelled = split_live(batch, started)
        flight = Launched(slot, BatchReport(self.label, [], started, padded=slot.padded))
        report = flight.report
        for item in expired:  # its future may already hold the timeout
            report.expired += item.rows
            report.results.append((item, DeadlineExceeded("deadline passed while queued")))
        for item in cancelled:
            report.cancelled += item.rows
            if item.request.deadlines is not None:  # the chunk's other rows still count it
                report.results.append((item, DROPPED))
        for group in group_by(live, lambda i: i.key):
            self._launch_group(executor, slot, group, flight)
        return flight

    def _launch_group(self, executor: DeviceExecutor, slot: Slot, items: list[PendingItem],
                      flight: Launched, apart: bool = False) -> int:
        """Launch ``items``. Where the model raises, app/failures.py says which parts are
        tried again (``apart``: parts of a failed batch) and what the rest are answered.
        Returns how many of its parts failed with nothing left to try (a request alone)."""
        report = flight.report
        rows = rows_in(items)
        try:
            with self.clock.timing(slot.model, rows):
                launch = executor.launch(slot.model.handler, slot.replica,
                                         [i.data for i in items], rows)
        except Exception as exc:
            retry = after_failure(exc, self.label, slot, items, rows, apart)
            if not isinstance(exc, torch.OutOfMemoryError):
                self._check_device(slot, rows)
            if retry.parts is None or self.fault is not None:
                report.results.extend((i, retry.error) for i in items)
                return 1
            failed = sum(self._launch_group(executor, slot, part, flight, retry.apart)
                         for part in retry.parts)
            if retry.apart and not apart:
                log_apart(self.label, slot.model.name, rows, failed)
            return failed
        flight.groups.append((items, launch))
        return 0

    def _settle(self, flights: list[Launched]) -> None:
        """Nothing is queued: wait for the oldest batch in flight and send its results
        (bench/nap.py measures sleeping on the bell first, for work that may come meanwhile)."""
        self._complete(flights.pop(0))

    def _complete(self, flight: Launched) -> None:
        """Wait for the batch's device work, split the outputs and send every result. The model
        learns from the batch on the event loop (``ServedModel.deliver``): until this thread
        sleeps, it holds the GIL that the loop needs to write the answers."""
        report = flight.report
        slot = flight.slot
        for items, launch in flight.groups:
            try:
                with self.clock.timing(slot.model, launch.n):
                    outputs, seconds = launch.wait()
            except Exception:
                log_failure(self.label, slot, launch.n)
                self._check_device(slot, launch.n)
                report.results.extend((i, ModelError()) for i in items)
                continue
            self.busy_s += seconds
            self._fairness.charge(slot.model, seconds)
            work, tokens = slot.work(items)
            report.sizes.append(launch.n)  # rows
            report.compute_s.append(seconds)
            report.work.append(work)
            report.tokens.append(tokens)
            report.results.extend(per_item(items, outputs))
        slot.rate.answered(time.monotonic())
        self._loop.call_soon_threadsafe(slot.model.deliver, report)

    def _check_device(self, slot: Slot, rows: int) -> None:
        """After the model raised: whether the device can still be used (``fault``)."""
        with self.clock.timing(slot.model, rows):  # a synchronize may hang too
            self.fault = self.fault or device_fault(self.device)
