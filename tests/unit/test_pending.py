"""What travels through a queue: an ``Answer`` settles once and says so at once, and a batch's
report resolves each request whose items are all in."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from app.errors import ModelError
from app.pending import (
    Answer,
    BatchReport,
    PendingItem,
    PendingRequest,
    per_item,
    queue_items,
    rows_in,
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


def test_a_report_resolves_a_request_once_every_item_is_in() -> None:
    seen: list[Answer] = []
    two = PendingRequest(Answer(seen.append, "two"), 2, 1e9, 1.0)
    one = PendingRequest(Answer(seen.append, "one"), 1, 1e9, 2.0)
    gone = PendingRequest(Answer(seen.append, "gone"), 1, 1e9, 2.0)
    assert gone.future.cancel()
    items = [PendingItem(two, 1, None), PendingItem(one, 0, None), PendingItem(gone, 0, None)]
    results: list[tuple[PendingItem, Any]] = [(items[0], "b"), (items[1], ModelError()),
                                              (items[2], "x")]
    waits = BatchReport("cpu", results, 3.0).answer()
    assert [a.key for a in seen] == ["gone", "one"] and not two.future.done()
    assert waits == [2.0]  # the item written into ``two``; the failure and the cancelled not
    waits = BatchReport("cpu", [(PendingItem(two, 0, None), "a")], 4.0).answer()
    assert two.future.result() == ["a", "b"] and waits == [3.0]


def test_a_chunk_takes_one_result_a_row_and_fills_its_rows_of_the_request() -> None:
    """A chunk of rows 1-2 and a row 0 of one request: one result a row in the batch's order
    pairs each item with its own (the chunk's as a list), and the request resolves once all
    three rows are in."""
    seen: list[Answer] = []
    request = PendingRequest(Answer(seen.append, "r"), 3, 1e9, 1.0)
    row, chunk = PendingItem(request, 0, "x0"), PendingItem(request, 1, ["x1", "x2"], rows=2)
    assert rows_in([row, chunk]) == 3
    paired = per_item([chunk, row], ["y1", "y2", "y0"])
    assert paired == [(chunk, ["y1", "y2"]), (row, "y0")]
    assert per_item([row], ["y0"]) == [(row, "y0")]
    assert BatchReport("cpu", paired[:1], 2.0).answer() == [1.0, 1.0]  # a wait a row
    assert not seen and request.remaining == 1
    assert BatchReport("cpu", paired[1:], 3.0).answer() == [2.0]
    assert seen and request.future.result() == ["y0", "y1", "y2"]


def test_a_request_whose_rows_are_one_chunk_gets_their_block_as_it_is() -> None:
    """All of a request's rows in one chunk of one batch: its answer is the batch's block of
    rows itself, not a list of a view a row (the renderers and the link take the block)."""
    seen: list[Answer] = []
    request = PendingRequest(Answer(seen.append, "r"), 3, 1e9, 1.0)
    chunk = PendingItem(request, 0, np.zeros((3, 2), np.float32), rows=3)
    outputs = np.arange(8, dtype=np.float32).reshape(4, 2)  # a batch: a row, then the chunk
    paired = per_item([PendingItem(request, 0, None), chunk], outputs)[1]
    assert BatchReport("cpu", [paired], 2.0).answer() == [1.0, 1.0, 1.0]
    block = seen[0].result()
    assert type(block) is np.ndarray and np.shares_memory(block, outputs)
    np.testing.assert_array_equal(block, outputs[1:])


def test_queue_items_make_an_item_a_row_or_one_chunk_for_stacked_rows() -> None:
    request = PendingRequest(Answer(lambda _: None, "r"), 3, 1e9, 1.0)
    rows = np.arange(6.0).reshape(3, 2)
    [chunk] = queue_items([(request, rows)], lambda _: None, stacks=True)
    assert (chunk.index, chunk.rows, chunk.data is rows) == (0, 3, True)
    apart = queue_items([(request, rows)], lambda _: "k", stacks=False)
    assert [(i.index, i.rows, i.key) for i in apart] == [(0, 1, "k"), (1, 1, "k"), (2, 1, "k")]
    listed = queue_items([(request, list(rows))], lambda _: None, stacks=True)  # not stacked
    assert [i.rows for i in listed] == [1, 1, 1]
