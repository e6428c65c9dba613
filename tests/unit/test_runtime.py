"""InferenceService with real device threads: one model, driven by gated fakes.

Several models (a repository folder) are in tests/unit/test_repository.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import torch

from app.errors import DeadlineExceeded, ModelError, NotFound, Unavailable
from app.models.base import ModelHandler
from app.models.builtin import linear_handler, mlp_module
from app.models.signature import TensorSpec
from app.models.tensor import TensorHandler
from app.runtime import RESTART_DELAY_S, InferenceService, build_service
from app.worker import WorkerState
from tests.conftest import make_settings, sample, wait_until
from tests.fakes import (
    BrokenLoadHandler,
    CrashingHandler,
    EchoHandler,
    FailingHandler,
    GatedHandler,
    OOMHandler,
)


@asynccontextmanager
async def running(handler: ModelHandler, ready: bool = True, **overrides: Any
                  ) -> AsyncIterator[InferenceService]:
    settings = make_settings(**overrides)
    service = build_service(settings, handler)
    await service.start()
    try:
        if ready:
            await wait_until(lambda: service.status == "ready", "ready")
        yield service
    finally:
        await service.stop(timeout_s=30)


async def call(service: InferenceService, values: list[Any], timeout_s: float = 30.0,
               name: str | None = None) -> list[Any]:
    """One request through the model's own admission, as the API makes it."""
    model = service.repository.get(name)
    items = await model.decode(values)
    request = model.enqueue(items, time.monotonic() + timeout_s)
    return await model.result(request)


def depth(service: InferenceService) -> int:
    return service.repository.get().queue.depth


@pytest.mark.asyncio
async def test_results_come_back_in_order() -> None:
    async with running(EchoHandler()) as service:
        assert [float(x) for x in await call(service, [1, 2, 3])] == [2.0, 4.0, 6.0]


@pytest.mark.asyncio
async def test_queued_requests_share_a_batch() -> None:
    handler = GatedHandler()
    async with running(handler) as service:
        first = asyncio.create_task(call(service, [0]))
        await wait_until(handler.entered.is_set, "first batch on the device")
        rest = [asyncio.create_task(call(service, [i])) for i in range(1, 9)]
        await wait_until(lambda: depth(service) == 8, "8 queued")
        handler.gate.set()
        await asyncio.gather(first, *rest)
    assert handler.batches == [[0.0], [float(i) for i in range(1, 9)]]


@pytest.mark.asyncio
async def test_a_full_queue_refuses_whole_requests() -> None:
    handler = GatedHandler()
    async with running(handler, queue_capacity=4, max_instances=4) as service:
        first = asyncio.create_task(call(service, [0]))
        await wait_until(handler.entered.is_set, "device busy")
        held = asyncio.create_task(call(service, [1, 2, 3]))
        await wait_until(lambda: depth(service) == 3, "3 queued")
        with pytest.raises(Unavailable) as info:
            await call(service, [4, 5])  # 2 items do not fit in the 1 free slot: none is queued
        assert info.value.type == "busy" and info.value.retry_after_s
        assert depth(service) == 3
        last = asyncio.create_task(call(service, [6]))  # 1 item still fits
        await wait_until(lambda: depth(service) == 4, "queue full")
        assert service.status == "busy"
        handler.gate.set()
        await asyncio.gather(first, held, last)
        assert service.status == "ready"
    assert 4.0 not in handler.seen and 5.0 not in handler.seen


@pytest.mark.asyncio
async def test_expired_items_are_dropped_not_computed() -> None:
    handler = GatedHandler()
    async with running(handler) as service:
        first = asyncio.create_task(call(service, [0]))
        await wait_until(handler.entered.is_set, "device busy")
        with pytest.raises(DeadlineExceeded):
            await call(service, [7], timeout_s=0.05)
        handler.gate.set()
        await first
        await call(service, [8])  # FIFO: by now the expired item has been taken and dropped
    assert 7.0 not in handler.seen and handler.seen == [0.0, 8.0]
    assert sample(service.metrics.registry, "batchserve_dropped_items_total",
                  model="echo", reason="expired") == 1


@pytest.mark.asyncio
async def test_the_effective_batch_limit_is_exported() -> None:
    async with running(OOMHandler(fits=2), max_batch_size=8) as service:
        await call(service, [1, 2, 3, 4, 5, 6, 7])
        limit = service.workers[0].batch_limit(service.repository.get())
        assert limit <= 2
        assert sample(service.metrics.registry, "batchserve_effective_batch_limit",
                      model="echo", device="cpu") == limit


@pytest.mark.asyncio
async def test_the_believed_cost_curve_is_exported() -> None:
    async with running(linear_handler(), max_batch_size=4) as service:
        cost = service.repository.get().costs["cpu"]
        for work, seconds in cost.curve():
            assert sample(service.metrics.registry, "batchserve_cost_seconds",
                          model=service.repository.get().name, device="cpu",
                          work=f"{work:g}") == seconds > 0
        assert [work for work, _ in cost.curve()] == [1, 2, 4]


@pytest.mark.asyncio
async def test_a_dead_device_thread_is_reported_and_restarted() -> None:
    handler = CrashingHandler()
    async with running(handler) as service:
        first = service.workers[0]
        with pytest.raises(ModelError):
            await call(service, [666])
        model = service.repository.get()
        # The thread reads failed at once; the loop marks its models unserved a step later.
        await wait_until(lambda: first.state is WorkerState.FAILED and model.stranded,
                         "thread dead")
        assert service.status == "unhealthy"
        with pytest.raises(Unavailable) as info:
            model.check_admissible(1)
        assert info.value.type == "unhealthy"
        registry = service.metrics.registry
        assert sample(registry, "batchserve_device_up", device="cpu") == 0
        await wait_until(lambda: service.status == "ready", "restarted")
        assert service.workers[0] is not first
        assert sample(registry, "batchserve_device_up", device="cpu") == 1
        assert sample(registry, "batchserve_device_restarts_total", device="cpu") == 1
        assert [float(x) for x in await call(service, [1])] == [2.0]


@pytest.mark.asyncio
async def test_a_device_thread_stuck_in_a_call_is_reported_until_it_returns() -> None:
    """A call past ``device_timeout_s``: health unhealthy, not live, admission refused at once,
    ``device_up`` 0, and no restart (a thread cannot be stopped); all clears when it returns."""
    handler = GatedHandler()
    async with running(handler, device_timeout_s=1) as service:
        first = asyncio.create_task(call(service, [1]))
        await wait_until(lambda: service.status == "unhealthy", "stuck seen")
        assert not service.live and handler.entered.is_set() and not first.done()
        with pytest.raises(Unavailable) as info:
            service.repository.get().check_admissible(1)
        assert info.value.type == "unhealthy"
        registry = service.metrics.registry
        assert sample(registry, "batchserve_device_up", device="cpu") == 0
        handler.gate.set()
        assert [float(x) for x in await first] == [2.0]
        await wait_until(lambda: service.status == "ready", "going on")
        assert service.live
        assert sample(registry, "batchserve_device_up", device="cpu") == 1
        assert sample(registry, "batchserve_device_restarts_total", device="cpu") == 0
        assert [float(x) for x in await call(service, [3])] == [6.0]


@pytest.mark.asyncio
async def test_a_broken_device_stops_its_thread_for_good_and_fails_liveness(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that fails on a device whose context then fails too (a sticky CUDA error, here
    ``device_fault`` stood in for): that batch gets 500, the thread stops and is not restarted,
    the model refuses at once, health unhealthy, not live."""
    fault = "CUDA error: an illegal memory access was encountered"
    monkeypatch.setattr("app.worker.device_fault", lambda device: fault)
    async with running(FailingHandler()) as service:
        first = service.workers[0]
        with pytest.raises(ModelError):
            await call(service, [-1])
        model = service.repository.get()
        await wait_until(lambda: first.state is WorkerState.FAILED and model.stranded,
                         "stopped")
        assert first.fault == fault and service.status == "unhealthy" and not service.live
        with pytest.raises(Unavailable) as info:
            model.check_admissible(1)
        assert info.value.type == "unhealthy"
        registry = service.metrics.registry
        assert sample(registry, "batchserve_device_up", device="cpu") == 0
        await asyncio.sleep(RESTART_DELAY_S * 1.5)  # a dead thread would be restarted by now
        assert service.workers == [first]
        assert sample(registry, "batchserve_device_restarts_total", device="cpu") == 0


@pytest.mark.asyncio
async def test_a_model_that_cannot_load_is_unavailable_with_the_reason() -> None:
    async with running(BrokenLoadHandler(), ready=False) as service:
        await wait_until(lambda: service.load_failed, "load failure seen")
        assert service.status == "unhealthy"
        with pytest.raises(Unavailable) as info:
            service.repository.get()
        assert info.value.type == "unavailable" and "weights are corrupt" in info.value.message
        assert service.repository.index() == [{"name": "echo", "version": "",
                                               "state": "UNAVAILABLE",
                                               "reason": "RuntimeError: weights are corrupt"}]


@pytest.mark.asyncio
async def test_two_cpu_replicas_share_the_queue() -> None:
    handler = GatedHandler()
    async with running(handler, devices="cpu,cpu", max_batch_size=1) as service:
        assert len(service.workers) == 2
        tasks = [asyncio.create_task(call(service, [i])) for i in range(2)]
        # With a batch limit of 1 and the gate closed, an empty queue means each thread holds one.
        await wait_until(lambda: depth(service) == 0, "both taken")
        handler.gate.set()
        await asyncio.gather(*tasks)
    assert sorted(handler.seen) == [0.0, 1.0]


@pytest.mark.asyncio
async def test_stop_answers_everything_queued() -> None:
    handler = GatedHandler()
    async with running(handler) as service:
        tasks = [asyncio.create_task(call(service, [i])) for i in range(5)]
        await wait_until(handler.entered.is_set, "device busy")
        service.begin_drain()
        with pytest.raises(Unavailable, match="shutting down"):
            await call(service, [9])
        stopping = asyncio.create_task(service.stop(timeout_s=30))
        handler.gate.set()
        await stopping
        assert sorted(float(r[0]) for r in await asyncio.gather(*tasks)) == [0, 2, 4, 6, 8]


@pytest.mark.asyncio
async def test_an_unknown_model_is_not_found() -> None:
    async with running(EchoHandler()) as service:
        with pytest.raises(NotFound, match="unknown model 'nope'"):
            service.repository.get("nope")
        with pytest.raises(NotFound, match="no version '2'"):
            service.repository.get("echo", "2")
        assert service.repository.get(None).name == "echo"


@pytest.mark.gpu
@pytest.mark.asyncio
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graphs", [False, True])
async def test_pipelined_cuda_worker_answers_every_request_in_order(
        graphs: bool, caplog: pytest.LogCaptureFixture) -> None:
    from app.models.builtin import mlp_handler

    handler = mlp_handler()
    with caplog.at_level(logging.INFO, logger="batchserve.warmup"):
        async with running(handler, devices="cuda", max_batch_size=16, queue_capacity=256,
                           cuda_graphs=graphs) as service:
            instances = [[float(i)] * 512 for i in range(100)]
            results = await asyncio.gather(*(call(service, [x]) for x in instances))
    assert ("captured as CUDA graphs for batches of 1, 2, 4, 8, 16" in caplog.text) is graphs
    with torch.inference_mode():
        want = handler.load(torch.device("cpu"))(torch.tensor(instances)).numpy()
    got = np.stack([r[0] for r in results])
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.asyncio
async def test_a_bare_module_learns_its_cost_and_outputs_from_its_first_request() -> None:
    """An nn.Module with no input_shape and no examples has nothing to warm up with: its first
    request's items measure the cost curve (off the request path) and its first batch shows
    the outputs, so it then batches as a module that declared them would."""
    handler = TensorHandler.from_module("bare", mlp_module((6, 8, 3)))
    async with running(handler, max_batch_size=8) as service:
        model = service.repository.get()
        assert not model.costs["cpu"].known and model.output_specs is None
        assert len((await call(service, [[1.0] * 6]))[0]) == 3
        await wait_until(lambda: len(model.costs["cpu"].curve()) == 4, "the cost measured")
        assert [work for work, _ in model.costs["cpu"].curve()] == [1, 2, 4, 8]
        # Learned once the batch's answers are out (ServedModel._account, after the futures).
        await wait_until(lambda: model.output_specs is not None, "the outputs learned")
        assert model.output_specs == [TensorSpec("OUTPUT0", "FP32", (3,))]
        assert model.full_batch_s() is not None  # deadline refusals can predict
        assert sample(service.metrics.registry, "batchserve_cost_seconds", model="bare",
                      device="cpu", work="8") > 0
