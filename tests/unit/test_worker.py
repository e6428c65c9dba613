"""DeviceWorker on its own: items in through a janus queue, BatchReports out to the loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import janus
import pytest
import torch

from app.batching import BatchPolicy, PendingItem, PendingRequest
from app.errors import DeadlineExceeded, ModelError
from app.models.base import ModelHandler
from app.models.builtin import linear_handler
from app.models.signature import TensorSpec
from app.worker import BatchReport, DeviceWorker, WorkerState
from tests.conftest import wait_until
from tests.fakes import (
    BrokenLoadHandler,
    CrashingHandler,
    EchoHandler,
    FailingHandler,
    GatedHandler,
    OOMHandler,
    WrongLengthHandler,
)

pytestmark = pytest.mark.asyncio


class Harness:
    """One worker on the CPU with its queue; every report and state change it sends back."""

    def __init__(self, worker: DeviceWorker, queue: janus.Queue[PendingItem]) -> None:
        self.worker = worker
        self.queue = queue
        self.reports: list[BatchReport] = []
        self.states: list[WorkerState] = []

    def put(self, *values: Any, timeout_s: float = 30.0) -> PendingRequest:
        """One request of ``values``, queued whole."""
        now = time.monotonic()
        request = PendingRequest(asyncio.get_running_loop().create_future(), len(values),
                                 now + timeout_s, now)
        for index, value in enumerate(values):
            self.queue.sync_q.put(PendingItem(request, index, value))
        return request

    def results(self) -> dict[float, Any]:
        """Every item's outcome so far, by its input value."""
        return {item.data: value for r in self.reports for item, value in r.results}

    async def settled(self, items: int) -> dict[float, Any]:
        await wait_until(lambda: len(self.results()) >= items, f"{items} results")
        return self.results()


@asynccontextmanager
async def worker(handler: ModelHandler, limit: int = 8, ready: bool = True
                 ) -> AsyncIterator[Harness]:
    queue: janus.Queue[PendingItem] = janus.Queue()
    harness: Harness

    def deliver(report: BatchReport) -> None:
        harness.reports.append(report)

    def changed(w: DeviceWorker) -> None:
        harness.states.append(w.state)

    # Nothing else in flight: the policy sends each batch as soon as what is queued is taken.
    w = DeviceWorker(torch.device("cpu"), handler, queue.sync_q, BatchPolicy(limit, 0.005),
                     asyncio.get_running_loop(), deliver, lambda: 0, changed)
    harness = Harness(w, queue)
    w.start()
    try:
        if ready:
            await wait_until(lambda: w.state is WorkerState.READY, "worker ready")
        yield harness
    finally:
        queue.shutdown()
        assert await asyncio.to_thread(w.join, 30)
        await queue.wait_closed()


async def test_warm_up_teaches_the_outputs() -> None:
    async with worker(linear_handler()) as h:
        assert h.worker.outputs == [TensorSpec("OUTPUT0", "FP32", (2,))]


async def test_queued_items_ride_one_batch_in_order() -> None:
    handler = GatedHandler()
    async with worker(handler) as h:
        h.put(0.0)
        await wait_until(handler.entered.is_set, "first batch on the device")
        h.put(1.0, 2.0)
        h.put(3.0)
        handler.gate.set()
        results = await h.settled(4)
    assert handler.batches == [[0.0], [1.0, 2.0, 3.0]]
    assert {k: float(v) for k, v in results.items()} == {0.0: 0.0, 1.0: 2.0, 2.0: 4.0, 3.0: 6.0}
    assert [r.sizes for r in h.reports] == [[1], [3]]


async def test_a_failing_batch_fails_only_its_items() -> None:
    async with worker(FailingHandler()) as h:
        h.put(1.0, -1.0)
        results = await h.settled(2)
        assert all(isinstance(v, ModelError) for v in results.values())
        assert "secret" not in results[1.0].message
        h.put(5.0)
        assert float((await h.settled(3))[5.0]) == 10.0
        assert h.worker.state is WorkerState.READY


async def test_a_wrong_output_count_fails_the_batch(caplog: pytest.LogCaptureFixture) -> None:
    async with worker(WrongLengthHandler()) as h:
        h.put(1.0, 2.0)
        results = await h.settled(2)
    assert all(isinstance(v, ModelError) for v in results.values())
    assert "model returned 1 rows for a batch of 2" in caplog.text


async def test_out_of_memory_splits_the_batch_and_lowers_the_limit() -> None:
    handler = OOMHandler(fits=2)
    async with worker(handler, limit=8) as h:
        h.put(*[float(i) for i in range(1, 8)])
        results = await h.settled(7)
        assert {k: float(v) for k, v in results.items()} == {float(i): 2.0 * i for i in range(1, 8)}
        assert h.worker.batch_limit <= 2 and max(handler.attempts[1:]) <= 4
        h.put(999.0)  # out of memory even alone: that item fails, nothing else
        failed = (await h.settled(8))[999.0]
        assert isinstance(failed, ModelError) and "out of device memory" in failed.message


async def test_expired_items_are_dropped_not_computed() -> None:
    handler = GatedHandler()
    async with worker(handler) as h:
        h.put(0.0)
        await wait_until(handler.entered.is_set, "device busy")
        h.put(7.0, timeout_s=0.0)  # its deadline has passed by the time it is taken
        handler.gate.set()
        results = await h.settled(2)
    assert isinstance(results[7.0], DeadlineExceeded) and 7.0 not in handler.seen
    assert sum(r.expired for r in h.reports) == 1


async def test_a_crash_fails_what_it_held_and_reports_the_death() -> None:
    async with worker(CrashingHandler()) as h:
        h.put(666.0)
        results = await h.settled(1)
        await wait_until(lambda: WorkerState.FAILED in h.states, "death reported")
    assert isinstance(results[666.0], ModelError)
    assert h.worker.state is WorkerState.FAILED and not h.worker.load_failed
    assert "Crash" in (h.worker.error or "")


async def test_a_model_that_cannot_load_says_why() -> None:
    async with worker(BrokenLoadHandler(), ready=False) as h:
        await wait_until(lambda: h.states, "state reported")
    assert h.states == [WorkerState.FAILED] and h.worker.load_failed
    assert h.worker.error == "RuntimeError: weights are corrupt"


async def test_ready_is_reported_once_warm() -> None:
    async with worker(EchoHandler()) as h:
        await wait_until(lambda: h.states, "state reported")
        assert h.states == [WorkerState.READY]
