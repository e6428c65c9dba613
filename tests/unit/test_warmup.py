"""warm_replica: load, warm up, learn the outputs and measure the cost grid."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import weakref
from typing import Any

import pytest
import torch

import app.warmup
from app.models.builtin import linear_handler
from app.models.signature import TensorSpec
from app.transfer import DeviceExecutor
from app.warmup import LONG_RUN_S, graphed, measure, warm_replica
from tests.fakes import EchoHandler, OOMHandler

pytestmark = pytest.mark.asyncio
CPU = torch.device("cpu")


async def test_warm_up_teaches_the_outputs_and_the_cost() -> None:
    warm = await asyncio.to_thread(warm_replica, linear_handler(), CPU, 8)
    assert callable(warm.replica) and warm.outputs == [TensorSpec("OUTPUT0", "FP32", (2,))]
    assert [work for work, _ in warm.cost.curve()] == [1, 2, 4, 8]
    assert all(seconds > 0 for _, seconds in warm.cost.curve())
    assert not warm.padded and warm.work_per_item == 1.0


async def test_a_text_models_cost_is_by_padded_tokens() -> None:
    from app.models.minilm import MiniLMHandler

    warm = await asyncio.to_thread(warm_replica, MiniLMHandler(), CPU, 4)
    works = [work for work, _ in warm.cost.curve()]
    assert works == sorted({n * length for n in (1, 2, 4) for length in (16, 128)})
    assert warm.padded and warm.work_per_item > 1


async def test_a_point_is_timed_three_times_unless_one_run_is_long() -> None:
    """Short points keep the median of three runs; a long one (most of a CPU's warm-up for a
    text model) is timed once."""
    class Clock:
        def __init__(self) -> None:
            self.runs: dict[int, list[float]] = {}

        def launch(self, _: Any, __: Any, batch: list[Any]) -> Any:
            n = len(batch)
            taken = self.runs.setdefault(n, [])
            # Short sizes: a slow first run (the median ignores it); long ones: LONG_RUN_S on.
            seconds = (LONG_RUN_S * n / 4 if n >= 4 else [0.05, 0.01, 0.01][len(taken)])
            taken.append(seconds)
            return type("Launch", (), {"wait": lambda _: (None, seconds)})()

    clock = Clock()
    cost, limit = measure(linear_handler(), None, clock, [[0.0] * 4], 8,  # type: ignore[arg-type]
                          padded=False)
    assert {n: len(runs) for n, runs in clock.runs.items()} == {1: 3, 2: 3, 4: 1, 8: 1}
    assert cost.curve() == [(1, 0.01), (2, 0.01), (4, LONG_RUN_S), (8, 2 * LONG_RUN_S)]
    assert limit == 8


@pytest.mark.parametrize(("limit", "fits", "found"), [
    (8, 2, 2), (8, 8, 8), (5, 1, 1),
    (6, 5, 4),  # 6 fails: half of it is 3, but 4 ran already
    (16, 11, 8),
])
async def test_the_warm_up_finds_the_largest_batch_that_fits(limit: int, fits: int,
                                                             found: int) -> None:
    """A batch out of device memory halves the limit, as serving does, until one fits (or keeps
    the largest batch that ran, where that is more)."""
    warm = await asyncio.to_thread(warm_replica, OOMHandler(fits, examples=[1.0]), CPU, limit)
    assert warm.batch_limit == found
    assert max(work for work, _ in warm.cost.curve()) == found


async def test_a_model_that_cannot_run_one_item_fails_to_load() -> None:
    with pytest.raises(torch.OutOfMemoryError):
        await asyncio.to_thread(warm_replica, OOMHandler(0, examples=[1.0]), CPU, 4)


async def test_a_refused_capture_logs_why_and_its_record_holds_no_replica(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Where a forward cannot be captured the log says why; the record keeps the reason's text,
    not the error, whose traceback's frames hold the replica (on a GPU, its memory) as long as
    a handler keeps the record (pytest's, a memory handler)."""
    class Replica:
        def __call__(self, batch: Any) -> Any:
            return batch

    executor = DeviceExecutor(CPU)
    # The capture path, which a CUDA executor's stream opens, taken on the CPU.
    executor.stream = object()  # type: ignore[assignment]
    monkeypatch.setattr(app.warmup.torch.cuda, "stream", lambda _: contextlib.nullcontext())
    replica = Replica()
    held = weakref.ref(replica)
    with caplog.at_level(logging.INFO, logger="batchserve.warmup"):
        assert graphed(EchoHandler(), replica, executor, 4, []) is replica
    assert "model echo on cpu: served without CUDA graphs: its items are not float32" in caplog.text
    del replica
    gc.collect()
    assert held() is None
