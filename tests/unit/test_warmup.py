"""warm_replica: load, warm up, learn the outputs and measure the cost grid."""

from __future__ import annotations

import asyncio

import pytest
import torch

from app.models.builtin import linear_handler
from app.models.signature import TensorSpec
from app.warmup import warm_replica

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
