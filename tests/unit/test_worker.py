"""DeviceWorker on its own: models attached to one device thread, their reports recorded."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import torch

from app.config import BatchSettings
from app.errors import DeadlineExceeded, ModelError
from app.metrics import Metrics
from app.models.base import ModelHandler, Tensors
from app.pending import PendingItem, PendingRequest
from app.report import BatchReport
from app.scheduler.cost import CostModel
from app.served import ServedModel
from app.transfer import DeviceExecutor, Launch
from app.warmup import warm_replica
from app.worker import DeviceWorker, WorkerState
from bench import nap
from tests.conftest import wait_until
from tests.fakes import (
    CrashingHandler,
    EchoHandler,
    FailingHandler,
    GatedHandler,
    OOMHandler,
    WrongLengthHandler,
)
from tests.holders import holders

pytestmark = pytest.mark.asyncio
CPU = torch.device("cpu")


class Harness:
    """One CPU device thread; the models attached to it and every report they got."""

    def __init__(self, worker: DeviceWorker) -> None:
        self.worker = worker
        self.models: dict[str, ServedModel] = {}
        self.reports: list[tuple[str, BatchReport]] = []
        self.states: list[WorkerState] = []

    async def attach(self, handler: ModelHandler, max_batch_size: int = 8) -> ServedModel:
        loop = asyncio.get_running_loop()
        settings = BatchSettings(max_batch_size=max_batch_size, max_wait_ms=5)
        model = ServedModel(handler.name, "1", settings, handler, [CPU],
                            Metrics.create().for_model(handler.name, "1"))
        model.open(loop, ThreadPoolExecutor(1))
        model.deliver = lambda report: self.reports.append((handler.name, report))  # type: ignore[method-assign]
        warm = await asyncio.to_thread(warm_replica, handler, CPU, max_batch_size)
        model.outputs = warm.outputs
        attached = asyncio.Event()
        self.worker.attach(model, warm, attached.set)
        await attached.wait()
        model.serve_with([self.worker.bell], [model])
        self.models[handler.name] = model
        return model

    def put(self, name: str, *values: Any, timeout_s: float = 30.0) -> PendingRequest:
        """One request of ``values`` for model ``name``, queued whole."""
        model = self.models[name]
        now = time.monotonic()
        request = PendingRequest(asyncio.get_running_loop().create_future(), len(values),
                                 now + timeout_s, now)
        for index, value in enumerate(values):
            model.queue.put(PendingItem(request, index, value))
        self.worker.bell.ring()
        return request

    def results(self) -> dict[float, Any]:
        """Every item's outcome so far, by its input value."""
        return {item.data: value for _, r in self.reports for item, value in r.results}

    async def settled(self, items: int) -> dict[float, Any]:
        await wait_until(lambda: len(self.results()) >= items, f"{items} results")
        return self.results()


@asynccontextmanager
async def device(*handlers: ModelHandler, max_batch_size: int = 8) -> AsyncIterator[Harness]:
    harness: Harness

    def changed(w: DeviceWorker) -> None:
        harness.states.append(w.state)

    worker = DeviceWorker(CPU, "cpu", asyncio.get_running_loop(), changed)
    harness = Harness(worker)
    worker.start()
    try:
        await wait_until(lambda: worker.state is WorkerState.READY, "worker ready")
        for handler in handlers:
            await harness.attach(handler, max_batch_size)
        yield harness
    finally:
        for model in harness.models.values():
            model.queue.shutdown()
        worker.stop()
        assert await asyncio.to_thread(worker.join, 30)


async def test_queued_items_ride_one_batch_in_order() -> None:
    handler = GatedHandler()
    async with device(handler) as h:
        h.put("echo", 0.0)
        await wait_until(handler.entered.is_set, "first batch on the device")
        h.put("echo", 1.0, 2.0)
        h.put("echo", 3.0)
        handler.gate.set()
        results = await h.settled(4)
    assert handler.batches == [[0.0], [1.0, 2.0, 3.0]]
    assert {k: float(v) for k, v in results.items()} == {0.0: 0.0, 1.0: 2.0, 2.0: 4.0, 3.0: 6.0}
    assert [r.sizes for _, r in h.reports] == [[1], [3]]


class Named(GatedHandler):
    """A gated echo under another name; ``cost_s`` of work per batch once the gate is open."""

    def __init__(self, name: str, cost_s: float, log: list[str]) -> None:
        super().__init__()
        self.name = name
        self.cost_s = cost_s
        self.log = log

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        out = super().compute(batch)
        self.log.append(self.name)
        time.sleep(self.cost_s)
        return out


async def test_two_models_share_one_device_thread() -> None:
    log: list[str] = []
    a, b = Named("a", 0.0, log), Named("b", 0.0, log)
    a.gate.set()
    b.gate.set()
    async with device(a, b) as h:
        h.put("a", 1.0, 2.0)
        h.put("b", 3.0)
        results = await h.settled(3)
    assert {k: float(v) for k, v in results.items()} == {1.0: 2.0, 2.0: 4.0, 3.0: 6.0}
    assert sorted(log) == ["a", "b"]
    assert {name for name, _ in h.reports} == {"a", "b"}


async def test_a_saturated_slow_model_holds_a_fast_one_back_one_batch_at_most() -> None:
    """The slow model has a backlog of many batches; a fast request arriving meanwhile runs
    right after the slow batch in progress, not after the backlog."""
    log: list[str] = []
    slow, fast = Named("slow", 0.02, log), Named("fast", 0.0, log)
    fast.gate.set()
    async with device(slow, fast, max_batch_size=2) as h:
        h.put("slow", 0.0)
        await wait_until(slow.entered.is_set, "the first slow batch on the device")
        for i in range(1, 21):  # ten more slow batches queued behind it
            h.put("slow", float(i))
        h.put("fast", 100.0)
        slow.gate.set()
        await h.settled(22)
    assert log.index("fast") <= 2, log  # after the batch in progress and at most one more


async def test_a_failing_batch_fails_only_its_items() -> None:
    async with device(FailingHandler()) as h:
        h.put("echo", 1.0, -1.0)
        results = await h.settled(2)
        assert all(isinstance(v, ModelError) for v in results.values())
        assert "secret" not in results[1.0].message
        h.put("echo", 5.0)
        assert float((await h.settled(3))[5.0]) == 10.0
        assert h.worker.state is WorkerState.READY


class GatedFailing(GatedHandler):
    """Gated; raises on a batch that holds a negative number (FailingHandler's)."""

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        out = super().compute(batch)
        if (batch < 0).any():
            raise ValueError("negative input")
        return out


async def test_the_requests_batched_with_one_the_model_fails_on_are_answered(
        caplog: pytest.LogCaptureFixture) -> None:
    """A batch of four requests, one with an item the model raises on: the batch is tried
    apart, down to requests alone; the others get their results, that one fails, and the
    batch's traceback is logged once."""
    handler = GatedFailing()
    async with device(handler) as h:
        h.put("echo", 0.0)
        await wait_until(handler.entered.is_set, "the first batch on the device")
        h.put("echo", 1.0, 2.0)
        h.put("echo", 3.0, -1.0)
        h.put("echo", 4.0)
        h.put("echo", 5.0)
        handler.gate.set()
        results = await h.settled(7)
    assert isinstance(results[-1.0], ModelError)
    assert {k: float(v) for k, v in results.items() if k not in (3.0, -1.0)} == {
        0.0: 0.0, 1.0: 2.0, 2.0: 4.0, 4.0: 8.0, 5.0: 10.0}
    assert caplog.text.count("Traceback") == 1
    assert "echo failed on a batch of 6; its requests are tried apart" in caplog.text
    assert "echo's batch of 6 tried apart: 1 of its requests failed alone" in caplog.text


async def test_a_model_that_fails_on_every_batch_fails_each_request_once(
        caplog: pytest.LogCaptureFixture) -> None:
    handler = GatedFailing()
    async with device(handler) as h:
        h.put("echo", 0.0)
        await wait_until(handler.entered.is_set, "the first batch on the device")
        for i in range(1, 6):
            h.put("echo", -float(i))
        handler.gate.set()
        results = await h.settled(6)
    assert all(isinstance(results[-float(i)], ModelError) for i in range(1, 6))
    assert sum(len(r.results) for _, r in h.reports) == 6  # one answer an item
    assert caplog.text.count("Traceback") == 1  # the batch's, and a line for its five:
    assert "echo's batch of 5 tried apart: 5 of its requests failed alone" in caplog.text
    assert len(caplog.records) == 2


async def test_a_wrong_output_count_fails_the_batch(caplog: pytest.LogCaptureFixture) -> None:
    async with device(WrongLengthHandler()) as h:
        h.put("echo", 1.0, 2.0)
        results = await h.settled(2)
    assert all(isinstance(v, ModelError) for v in results.values())
    assert "model returned 1 rows for a batch of 2" in caplog.text


async def test_out_of_memory_splits_the_batch_and_lowers_the_limit() -> None:
    handler = OOMHandler(fits=2)
    async with device(handler, max_batch_size=8) as h:
        h.put("echo", *[float(i) for i in range(1, 8)])
        results = await h.settled(7)
        assert {k: float(v) for k, v in results.items()} == {float(i): 2.0 * i for i in range(1, 8)}
        model = h.models["echo"]
        assert h.worker.batch_limit(model) <= 2 and max(handler.attempts[1:]) <= 4
        h.put("echo", 999.0)  # out of memory even alone: that item fails, nothing else
        failed = (await h.settled(8))[999.0]
        assert isinstance(failed, ModelError) and "out of device memory" in failed.message


class ChunkOOMHandler(OOMHandler):
    """OOMHandler whose rows stack: it takes chunks (arrays of rows) among its items."""

    stacks = True

    def collate(self, items: list[Any]) -> Tensors:
        return torch.tensor(np.concatenate([np.atleast_1d(i) for i in items]),
                            dtype=torch.float64)


async def test_out_of_memory_on_one_chunk_splits_the_chunk() -> None:
    handler = ChunkOOMHandler(fits=2)
    async with device(handler, max_batch_size=8) as h:
        model = h.models["echo"]
        now = time.monotonic()
        request = PendingRequest(asyncio.get_running_loop().create_future(), 6, now + 30, now)
        model.queue.put(PendingItem(request, 0, np.arange(1.0, 7.0), rows=6))
        h.worker.bell.ring()
        await wait_until(lambda: sum(len(r.results) for _, r in h.reports) >= 4, "answers")
        for _, report in h.reports:
            report.answer()
        assert request.future.result() == [2.0 * i for i in range(1, 7)]
        assert max(handler.attempts[1:]) <= 3 and h.worker.batch_limit(model) <= 2


async def test_expired_items_are_dropped_not_computed() -> None:
    handler = GatedHandler()
    async with device(handler) as h:
        h.put("echo", 0.0)
        await wait_until(handler.entered.is_set, "device busy")
        h.put("echo", 7.0, timeout_s=0.0)  # its deadline has passed by the time it is taken
        handler.gate.set()
        results = await h.settled(2)
    assert isinstance(results[7.0], DeadlineExceeded) and 7.0 not in handler.seen
    assert sum(r.expired for _, r in h.reports) == 1


async def test_a_crash_fails_what_it_held_and_reports_the_death() -> None:
    async with device(CrashingHandler()) as h:
        h.put("echo", 666.0)
        results = await h.settled(1)
        await wait_until(lambda: WorkerState.FAILED in h.states, "death reported")
    assert isinstance(results[666.0], ModelError)
    assert h.worker.state is WorkerState.FAILED and "Crash" in (h.worker.error or "")


async def test_detach_releases_the_model_and_the_thread_goes_on() -> None:
    async with device(EchoHandler(), Named("other", 0.0, [])) as h:
        model = h.models["echo"]
        detached = asyncio.Event()
        h.worker.detach(model, detached.set)
        await detached.wait()
        assert not h.worker.holds(model) and h.worker.holds(h.models["other"])
        h.models["other"].handler.gate.set()  # type: ignore[attr-defined]
        h.put("other", 4.0)
        assert float((await h.settled(1))[4.0]) == 8.0


class Preempted:
    """The worker's loop, whose ``call_soon_threadsafe`` of ``callback`` leaves the calling
    thread asleep a while after it: as a thread the OS preempts right after it wakes the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Any) -> None:
        self._loop = loop
        self._callback = callback

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> asyncio.Handle:
        handle = self._loop.call_soon_threadsafe(callback, *args)
        if callback == self._callback:
            time.sleep(0.3)
        return handle


async def test_a_detached_model_is_let_go_before_its_done_runs() -> None:
    """By the time ``done`` runs, the thread holds nothing of the model, however long it takes
    to go on after waking the loop: an unload's caller may find it collected at once."""
    async with device(EchoHandler()) as h:
        model = h.models.pop("echo")
        # Its gauges read it; an unload drops them first (app/runtime.py, ``unexport``).
        model.metrics.metrics.forget_model("echo", "1")
        gone = weakref.ref(model)
        detached = asyncio.Event()
        h.worker._loop = Preempted(h.worker._loop, detached.set)  # type: ignore[assignment]
        h.worker.detach(model, detached.set)
        del model
        await detached.wait()
        gc.collect()
        assert gone() is None, holders(gone())


async def test_an_idle_thread_sleeps_until_work_rings(monkeypatch: pytest.MonkeyPatch) -> None:
    """With idle sleeps of an hour, only the bell that a put rings can wake the thread."""
    monkeypatch.setattr("app.worker.IDLE_S", 3600.0)
    async with device(EchoHandler()) as h:
        await wait_until(lambda: h.worker.bell.asleep, "asleep")
        h.put("echo", 2.0)
        assert float((await h.settled(1))[2.0]) == 4.0
        await wait_until(lambda: h.worker.bell.asleep, "asleep again")
        h.put("echo", 3.0)
        assert float((await h.settled(2))[3.0]) == 6.0


async def test_ready_is_reported_once_started() -> None:
    async with device() as h:
        await wait_until(lambda: h.states, "state reported")
        assert h.states == [WorkerState.READY]


class Gate:
    """A CUDA event's stand-in for a launch: ``synchronize`` waits till the test opens it."""

    def __init__(self, open_: bool = False) -> None:
        self.opened = threading.Event()
        if open_:
            self.opened.set()

    def synchronize(self) -> None:
        assert self.opened.wait(30), "the test never opened the gate"


async def test_bench_nap_launches_what_comes_while_a_batch_is_in_flight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/nap.py: with a batch in flight (its launch pending, as on CUDA) and nothing queued,
    the thread naps on its bell before that batch's wait, so a request that comes meanwhile is
    launched before the batch is done; its results and the batch's all arrive."""
    monkeypatch.setattr(DeviceWorker, "_settle", nap.napping_settle)
    gates = [Gate(open_=True), Gate()]  # the first batch done at once, the second held
    launched: list[float] = []
    real = DeviceExecutor.launch
    # the second batch's predicted time: the nap before its wait is 0.8 of it, unless work
    # rings first; the others' none
    monkeypatch.setattr(CostModel, "predict",
                        lambda self, work: 60.0 if launched == [1.0, 2.0] else 0.0)

    def pending_launch(self: DeviceExecutor, handler: ModelHandler, replica: Any,
                       data: list[Any], rows: int | None = None) -> Launch:
        launch = real(self, handler, replica, data, rows)
        launch.done = gates.pop(0) if gates else Gate(open_=True)  # type: ignore[assignment]
        launched.extend(float(x) for x in data)
        return launch

    monkeypatch.setattr(DeviceExecutor, "launch", pending_launch)
    held = gates[1]
    async with device(EchoHandler()) as h:
        h.put("echo", 1.0)
        await h.settled(1)
        h.put("echo", 2.0)  # its batch stays in flight; the thread naps before its wait
        await wait_until(lambda: launched == [1.0, 2.0] and h.worker.bell.asleep
                         and len(h.results()) == 1, "a nap while 2.0's batch computes")
        h.put("echo", 3.0)
        await wait_until(lambda: 3.0 in launched, "3.0 launched while 2.0's batch computes")
        assert not held.opened.is_set() and len(h.results()) == 1
        held.opened.set()
        results = await h.settled(3)
        assert {k: float(v) for k, v in results.items()} == {1.0: 2.0, 2.0: 4.0, 3.0: 6.0}
