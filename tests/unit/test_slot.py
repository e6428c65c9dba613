"""Slot: where a model's next batch comes from, and what a batch is worth."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from app.config import BatchSettings
from app.metrics import Metrics
from app.pending import PendingItem, PendingRequest
from app.scheduler.cost import CostModel
from app.served import ServedModel
from app.slot import SimilarLengths, Slot
from tests.fakes import EchoHandler


class Lengths(EchoHandler):
    """Text-like: an item's value is its length in tokens."""

    def length(self, item: Any) -> int | None:
        return int(item)


def slot(padded: bool = True, **settings: Any) -> Slot:
    handler = Lengths() if padded else EchoHandler()
    model = ServedModel("m", "1", BatchSettings(max_batch_size=4, **settings), handler,
                        [torch.device("cpu")], Metrics.create().for_model("m", "1"))
    return Slot(model, handler.compute, 4, CostModel([1.0, 40.0], [0.001, 0.004]), padded)


def items(*lengths: float) -> list[PendingItem]:
    request = PendingRequest(asyncio.get_running_loop().create_future(), len(lengths), 1e9, 0.0)
    return [PendingItem(request, i, float(n)) for i, n in enumerate(lengths)]


def test_a_model_without_lengths_or_with_window_one_takes_arrival_order() -> None:
    plain = slot(padded=False)
    assert plain.source() is plain.model.queue
    windowless = slot(length_window=1)
    assert windowless.source() is windowless.model.queue


def test_a_text_models_default_budget_is_twice_a_typical_full_batch() -> None:
    text = slot()
    text.model.tokens_per_item = 10.0
    source = text.source()
    assert isinstance(source, SimilarLengths)
    assert source.max_tokens == 80 and source.window == 256  # 2 x 4 items x 10 tokens
    given = slot(max_batch_tokens=50, length_window=2)
    source = given.source()
    assert isinstance(source, SimilarLengths)
    assert source.max_tokens == 50 and source.window == 4  # the window holds one full batch


@pytest.mark.asyncio
async def test_a_batch_is_worth_its_padded_tokens_or_its_items() -> None:
    assert slot().work(items(2, 6)) == (12, 8)  # padded to 2 x 6 = 12 tokens, 8 real
    assert slot(padded=False).work(items(2, 6)) == (2, 2)  # an item is one unit of work
