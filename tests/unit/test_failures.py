"""app/failures.py: which parts of a failed model call are tried again, and what the rest get."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from app.errors import ModelError
from app.failures import TRACEBACK_EVERY_S, after_failure
from app.pending import Answer, PendingItem, PendingRequest


class FakeSlot:
    def __init__(self, batch_limit: int) -> None:
        self.batch_limit = batch_limit
        self.model = type("Model", (), {"name": "m"})()
        self.traced: tuple[str, float] | None = None


def requests(*sizes: int) -> list[PendingItem]:
    """Items of requests of these sizes, in order."""
    items = []
    for n in sizes:
        request = PendingRequest(Answer(lambda _: None, None), n, 1e9, 1.0)
        items += [PendingItem(request, i, float(i)) for i in range(n)]
    return items


def fail(exc: Exception, slot: Any, items: list[PendingItem], apart: bool = False) -> Any:
    try:
        raise exc
    except Exception as caught:  # as the device thread calls it: where the error is caught
        return after_failure(caught, "cpu", slot, items, len(items), apart)


def test_out_of_memory_halves_and_lowers_the_batch_limit_down_to_one_item() -> None:
    slot, items = FakeSlot(8), requests(1, 1, 1, 1)
    retry = fail(torch.OutOfMemoryError("oom"), slot, items)
    assert retry.parts == (items[:2], items[2:]) and slot.batch_limit == 2 and not retry.apart
    alone = fail(torch.OutOfMemoryError("oom"), slot, items[:1])
    assert alone.parts is None and "out of device memory" in alone.error.message


def test_a_raise_halves_several_requests_down_to_one(caplog: pytest.LogCaptureFixture) -> None:
    slot, items = FakeSlot(8), requests(2, 1)
    with caplog.at_level(logging.ERROR, logger="batchserve.worker"):
        retry = fail(ValueError("bad input"), slot, items)
        assert retry.parts == (items[:1], items[1:]) and retry.apart
        assert slot.batch_limit == 8 and isinstance(retry.error, ModelError)
        one = fail(ValueError("bad input"), slot, items[:2], apart=True)  # one request's
        assert one.parts is None
    [record] = caplog.records  # the batch's traceback; its parts' failures log_apart counts
    assert record.exc_info is not None and "its requests are tried apart" in record.getMessage()


def test_the_same_error_again_is_a_line_its_traceback_again_after_a_while(
        caplog: pytest.LogCaptureFixture) -> None:
    """A model broken on every batch, or a client sending what it cannot take, does not flood
    the log with tracebacks: one, then a line a batch while the error is the same."""
    slot = FakeSlot(8)
    with caplog.at_level(logging.ERROR, logger="batchserve.worker"):
        for _ in range(3):
            fail(ValueError("bad input\ndetail"), slot, requests(1))
        fail(KeyError("other"), slot, requests(1))
        assert slot.traced is not None
        slot.traced = (slot.traced[0], slot.traced[1] - TRACEBACK_EVERY_S)  # a while ago
        fail(KeyError("other"), slot, requests(1))
    traced = [r.exc_info is not None for r in caplog.records]
    assert traced == [True, False, False, True, True]
    assert "(ValueError: bad input, as logged before)" in caplog.records[1].getMessage()
