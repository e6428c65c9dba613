"""What travels through a queue: an ``Answer`` settles once and says so at once; a request's
items are an item a row, or one chunk of stacked rows."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from app.errors import ModelError
from app.pending import Answer, PendingRequest, queue_items


def test_an_answer_settles_once_and_calls_back_at_once() -> None:
    seen: list[Answer] = []
    answer = Answer(seen.append, "r1")
    assert not answer.done() and answer.exception() is None
    answer.set_result([1, 2])
    assert seen == [answer] and answer.key == "r1"  # no event-loop pass in between
    assert answer.done() and not answer.cancelled() and answer.result() == [1, 2]
    with pytest.raises(asyncio.InvalidStateError):
        answer.set_exception(ModelError())
    assert not answer.cancel() and seen == [answer]  # a settled answer is not cancelled


def test_a_cancelled_or_failed_answer_says_which() -> None:
    seen: list[Answer] = []
    cancelled, failed = Answer(seen.append, 1), Answer(seen.append, 2)
    assert cancelled.cancel() and cancelled.cancelled() and cancelled.exception() is None
    error = ModelError()
    failed.set_exception(error)
    assert failed.exception() is error and not failed.cancelled()
    assert seen == [cancelled, failed]


def test_queue_items_make_an_item_a_row_or_one_chunk_for_stacked_rows() -> None:
    request = PendingRequest(Answer(lambda _: None, "r"), 3, 1e9, 1.0)
    rows = np.arange(6.0).reshape(3, 2)
    [chunk] = queue_items([(request, rows)], lambda _: None, stacks=True)
    assert (chunk.index, chunk.rows, chunk.data is rows) == (0, 3, True)
    apart = queue_items([(request, rows)], lambda _: "k", stacks=False)
    assert [(i.index, i.rows, i.key) for i in apart] == [(0, 1, "k"), (1, 1, "k"), (2, 1, "k")]
    listed = queue_items([(request, list(rows))], lambda _: None, stacks=True)  # not stacked
    assert [i.rows for i in listed] == [1, 1, 1]
