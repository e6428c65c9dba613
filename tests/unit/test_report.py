"""A batch's report (app/report.py) resolves each request whose items are all in, and hands a
chunk of one-row requests its rows as they are computed."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.errors import ModelError
from app.pending import (
    DROPPED,
    Answer,
    PendingItem,
    PendingRequest,
    RowsAnswer,
    rows_in,
    rows_request,
)
from app.report import BatchReport, per_item


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


def test_a_chunks_rows_go_to_its_answer_in_runs_as_batches_compute_them() -> None:
    """A chunk of four one-row requests queued an item a row (token ids of each length): each
    batch hands the chunk's answer its rows as they are done, consecutive rows computed in it
    as one run (a list of their results), a failed or dropped row on its own; the answer is
    set (None) once every row is, not before."""
    runs: list[tuple[int, int, Any]] = []
    done: list[Answer] = []
    answer = RowsAnswer(done.append, lambda a, at, n, value: runs.append((at, n, value)),
                        [10, 11, 12, 13], [None] * 4)
    request = rows_request(answer, [1e9] * 4, 1.0, 1)
    items = [PendingItem(request, i, np.arange(i + 1)) for i in range(4)]
    error = ModelError()
    first = [(items[0], "y0"), (items[1], "y1"), (items[3], error)]
    assert BatchReport("cpu", first, 2.0).answer() == [1.0, 1.0]  # a wait a row computed
    assert runs == [(0, 2, ["y0", "y1"]), (3, 1, error)] and not done
    assert request.remaining == 1
    assert BatchReport("cpu", [(items[2], DROPPED)], 3.0).answer() == []
    assert runs[-1] == (2, 1, DROPPED) and done == [answer] and answer.result() is None
    runs.clear()
    other = rows_request(RowsAnswer(done.append, lambda a, at, n, v: runs.append((at, n, v)),
                                    [20, 21], [None] * 2), [1e9] * 2, 1.0, 1)
    apart = [(PendingItem(other, 1, None), "z1"), (PendingItem(other, 0, None), "z0")]
    BatchReport("cpu", apart, 2.0).answer()  # not in row order: a run each
    assert runs == [(1, 1, "z1"), (0, 1, "z0")] and done[-1] is other.future
