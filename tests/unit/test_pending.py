"""What travels through a queue: an ``Answer`` settles once and says so at once; a request's
items are an item a row, or one chunk of stacked rows."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from app.errors import ModelError
from app.pending import (
    Answer,
    PendingItem,
    PendingRequest,
    halves,
    one_request,
    queue_items,
    rows_request,
)


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


def test_halves_split_items_or_a_lone_chunks_rows_down_to_one_instance() -> None:
    request = PendingRequest(Answer(lambda _: None, "r"), 3, 1e9, 1.0)
    items = [PendingItem(request, i, float(i)) for i in range(3)]
    assert halves(items, 3) == (items[:1], items[1:])
    chunk = PendingItem(request, 0, np.arange(6.0).reshape(3, 2), rows=3)
    parts = halves([chunk], 3)
    assert parts is not None
    assert [(p[0].index, p[0].rows) for p in parts] == [(0, 1), (1, 2)]
    assert halves(items[:1], 1) is None


def test_one_request_is_one_requests_items_or_one_row_of_one_row_requests() -> None:
    first = PendingRequest(Answer(lambda _: None, "a"), 2, 1e9, 1.0)
    second = PendingRequest(Answer(lambda _: None, "b"), 1, 1e9, 1.0)
    both = [PendingItem(first, 0, 1.0), PendingItem(first, 1, 2.0)]
    assert one_request(both, 2)
    assert not one_request([*both, PendingItem(second, 0, 3.0)], 3)
    rows = rows_request(Answer(lambda _: None, "c"), [1e9, 1e9], 1.0, 1)  # two clients' rows
    chunk = PendingItem(rows, 0, np.zeros((2, 2)), rows=2)
    assert not one_request([chunk], 2)
    assert one_request([chunk.split(1)[0]], 1)
