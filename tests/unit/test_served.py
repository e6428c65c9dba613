"""ServedModel: priorities and deadline-aware admission (with a real device thread), and what
a delivered batch teaches it."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
import torch

from app.config import BatchSettings
from app.errors import InvalidInput, Unavailable, WouldMissDeadline
from app.metrics import Metrics
from app.report import BatchReport
from app.runtime import InferenceService
from app.scheduler.cost import CostModel
from app.served import WORK_WEIGHT, ServedModel
from app.state import ModelState
from tests.conftest import wait_until
from tests.fakes import EchoHandler, GatedHandler, SteadyHandler
from tests.unit.test_runtime import running

pytestmark = pytest.mark.asyncio


async def call(model: ServedModel, values: list[Any], level: int | None = None,
               timeout_s: float = 30.0) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    model.check_admissible(len(values), level, deadline)
    request = model.enqueue(await model.decode(values), deadline, level)
    return await model.result(request)


def only(service: InferenceService) -> ServedModel:
    return service.repository.get()


async def test_an_urgent_request_goes_before_less_urgent_ones() -> None:
    handler = GatedHandler()
    async with running(handler, max_batch_size=2) as service:
        model = only(service)
        first = asyncio.create_task(call(model, [0]))
        await wait_until(handler.entered.is_set, "device busy")
        later = [asyncio.create_task(call(model, [v])) for v in (1, 2)]  # default: level 2
        urgent = asyncio.create_task(call(model, [3], level=1))
        await wait_until(lambda: model.queue.depth == 3, "three queued")
        handler.gate.set()
        await asyncio.gather(first, urgent, *later)
    assert handler.batches == [[0.0], [3.0, 1.0], [2.0]]


async def test_a_closed_loop_answered_a_moment_ago_still_counts_all_its_clients() -> None:
    """Sixteen clients in flight, all answered: they are on their way back, and a device thread
    deciding now must expect sixteen, not fifteen (it would start a batch of fifteen and leave
    the last to a batch of its own)."""
    handler = GatedHandler()
    async with running(handler, max_batch_size=16) as service:
        model = only(service)
        clients = [asyncio.create_task(call(model, [v])) for v in range(16)]
        await wait_until(lambda: model.in_flight == 16, "sixteen in flight")
        handler.gate.set()
        await asyncio.gather(*clients)
        assert model.in_flight == 0 and model.concurrency() == 16


async def test_under_overload_the_least_urgent_are_refused_first() -> None:
    """Two levels, capacity 4: ordinary traffic fills the queue; urgent requests still get in."""
    handler = GatedHandler()
    async with running(handler, queue_capacity=4, max_instances=4) as service:
        model = only(service)
        tasks = [asyncio.create_task(call(model, [0]))]
        await wait_until(handler.entered.is_set, "device busy")
        tasks.append(asyncio.create_task(call(model, [1, 2, 3, 4])))
        await wait_until(lambda: model.queue.depth == 4, "queue full at the default level")
        with pytest.raises(Unavailable, match="queue is full") as info:
            model.check_admissible(1)
        assert info.value.type == "busy" and model.health == "busy"
        tasks.append(asyncio.create_task(call(model, [5, 6], level=1)))  # urgent: room for 2
        await wait_until(lambda: model.queue.depth == 6, "urgent admitted")
        with pytest.raises(Unavailable, match="no room at priority 1"):
            model.check_admissible(1, level=1)
        handler.gate.set()
        await asyncio.gather(*tasks)
    assert handler.seen.index(5.0) < handler.seen.index(1.0)


async def test_a_level_out_of_range_is_refused_naming_the_range() -> None:
    async with running(GatedHandler(), priority_levels=3) as service:
        model = only(service)
        assert model.level_of(None) == 3 and model.level_of(0) == 3 and model.level_of(2) == 2
        with pytest.raises(InvalidInput, match=r"priority 4 is out of range.*urgent\) to 3"):
            model.level_of(4)


async def test_a_request_that_would_miss_its_deadline_is_refused_at_once() -> None:
    """A flat 50 ms per batch of 2: with five or more items queued, a request due in 0.1 s
    cannot be answered in time (the batch in progress and three more: 0.2 s); one due in 10 s
    can, and so can an urgent one due in 0.2 s, which waits for nothing queued."""
    handler = SteadyHandler(cost_s=0.05)
    async with running(handler, max_batch_size=2) as service:
        model = only(service)
        handler.gate.clear()
        handler.entered.clear()  # the warm-up's call set it
        tasks = [asyncio.create_task(call(model, [0]))]
        await wait_until(handler.entered.is_set, "device busy")
        tasks += [asyncio.create_task(call(model, [v])) for v in range(1, 7)]
        # five or six queued (the held batch may have waited for a second item, as it should)
        await wait_until(lambda: model.queue.depth >= 5, "queued")
        started = time.monotonic()
        # Refused at once: the check is a plain call, it cannot wait for the deadline.
        with pytest.raises(WouldMissDeadline, match="after the request's deadline") as info:
            model.check_admissible(1, None, time.monotonic() + 0.1)
        assert info.value.status == 503 and info.value.type == "deadline"
        # Durations read as ms below a second (not "0.000s" for a deadline microseconds away).
        assert re.search(r"would answer in about [\d.]+ m?s, after the request's deadline "
                         r"\((in [\d.]+ ms|already passed)\)$", info.value.message), info.value
        assert info.value.retry_after_s is not None and info.value.retry_after_s >= 1
        model.check_admissible(1, None, time.monotonic() + 10.0)
        model.check_admissible(1, 1, time.monotonic() + 0.2)
        handler.gate.set()
        opened = time.monotonic()
        done, _ = await asyncio.wait(tasks)
        # Once, on two busy cores, a call here read its 30 s deadline passed: what was left
        # then says where it waited.
        assert all(t.exception() is None for t in done), (
            f"{time.monotonic() - opened:.1f} s after the gate opened, {started - opened:.1f} "
            f"s before: {model.queue.depth} queued, {model.in_flight} in flight, threads "
            f"{[(w.state, w.clock.stuck) for w in service.workers]}",
            [t.exception() for t in done])


async def test_one_batch_seen_is_no_curve_to_refuse_a_deadline_on() -> None:
    """A model with no warm-up examples has seen one batch before its first request's
    measurement lands: a cold first call, 0.6 s for one item, scaled to a full batch of 32
    would predict 19 s a batch and refuse a request due in 10 s behind one queued item. One
    batch is no curve: nothing is refused on it; a curve of two points refuses that request."""
    handler = GatedHandler()  # no examples: the warm-up measures no cost
    async with running(handler, max_batch_size=32) as service:
        model = only(service)
        tasks = [asyncio.create_task(call(model, [0]))]
        await wait_until(handler.entered.is_set, "device busy")
        tasks.append(asyncio.create_task(call(model, [1])))
        await wait_until(lambda: model.queue.depth == 1, "one queued")
        cold = CostModel()
        cold.observe(1, 0.6)
        model.learn("cpu", cold, 1.0, None, 32)
        assert model.full_batch_s() is None
        model.check_admissible(1, None, time.monotonic() + 10.0)
        model.learn("cpu", CostModel([1, 32], [0.6, 19.2]), 1.0, None, 32)
        with pytest.raises(WouldMissDeadline):
            model.check_admissible(1, None, time.monotonic() + 10.0)
        handler.gate.set()
        await asyncio.gather(*tasks)


async def test_a_batch_is_counted_and_learned_from_after_its_answers_go_out() -> None:
    """deliver resolves the futures first; the metrics and the cost model's refinement run after
    the code awaiting them (in a closed loop the device waits on those answers' round trip)."""
    metrics = Metrics.create()
    model = ServedModel("m", "1", BatchSettings(), EchoHandler(), [torch.device("cpu")],
                        metrics.for_model("m", "1"))
    model.open(asyncio.get_running_loop(), None)  # type: ignore[arg-type]  # no pool: not decoding
    model.set_state(ModelState.READY)
    cost = model.costs["cpu"] = CostModel([1.0, 40.0], [0.001, 0.004])
    request = model.enqueue([1.0, 2.0], time.monotonic() + 30)
    items = model.queue.take(2)
    before = cost.predict(12)
    when_answered: list[float] = []

    async def client() -> list[Any]:
        results = await model.result(request)
        when_answered.append(cost.predict(12))
        return results

    task = asyncio.create_task(client())
    await asyncio.sleep(0)  # the client now waits on its future
    # One call of 2 items padded to 6 tokens each (12), 8 real, slower than the model believes.
    model.deliver(BatchReport("cpu", [(i, i.data * 2) for i in items], request.enqueued_at + 0.5,
                              sizes=[2], compute_s=[1.0], work=[12], tokens=[8], padded=True))
    assert await task == [2.0, 4.0]
    assert when_answered == [before]  # answered before anything was learned
    await asyncio.sleep(0)
    assert cost.predict(12) > before
    assert model.work_per_item == pytest.approx(1 + WORK_WEIGHT * (6 - 1))
    assert model.tokens_per_item == pytest.approx(1 + WORK_WEIGHT * (4 - 1))
    sample = metrics.registry.get_sample_value
    assert sample("batchserve_padding_waste_ratio_sum", {"model": "m"}) == pytest.approx(1 / 3)
    assert sample("batchserve_queue_wait_seconds_count", {"model": "m"}) == 2  # one per item
    assert sample("batchserve_queue_wait_seconds_sum", {"model": "m"}) == pytest.approx(1.0)
    assert sample("batchserve_batch_size_sum", {"model": "m"}) == 2
