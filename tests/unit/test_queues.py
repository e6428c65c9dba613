"""ModelQueue: janus in from the loop, a staging area the device threads take from."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from app.pending import PendingItem, PendingRequest
from app.queues import ModelQueue

pytestmark = pytest.mark.asyncio


def items(n: int) -> list[PendingItem]:
    loop = asyncio.get_running_loop()
    request = PendingRequest(loop.create_future(), n, 1e9, 0.0)
    return [PendingItem(request, i, float(i)) for i in range(n)]


async def test_head_shows_the_oldest_without_taking_it() -> None:
    q = ModelQueue(capacity=8)
    q.open()
    assert q.head() is None
    for item in items(3):
        q.put(item)
    assert q.head().data == 0.0 and q.depth == 3  # type: ignore[union-attr]
    assert [i.data for i in q.take(2)] == [0.0, 1.0]
    assert q.depth == 1
    assert [i.data for i in q.take(5)] == [2.0] and q.take(5) == []


async def test_a_chunk_counts_its_rows_and_a_take_splits_what_does_not_fit() -> None:
    """A chunk (rows stacked in one item) counts as its rows; a take that has room for part of
    it takes its first rows, and the rest stays first in line at its level."""
    q = ModelQueue(capacity=8, levels=2)
    q.open()
    loop = asyncio.get_running_loop()
    chunked = PendingRequest(loop.create_future(), 5, 1e9, 0.0, level=2)
    urgent = PendingRequest(loop.create_future(), 1, 1e9, 0.0, level=1)
    q.put(PendingItem(chunked, 0, np.arange(5.0), rows=5))
    q.put(PendingItem(urgent, 0, 9.0))
    assert q.depth == 6 and q.depth_through(1) == 1
    first = q.take(3)
    assert [(i.request, i.index, i.rows) for i in first] == [(urgent, 0, 1), (chunked, 0, 2)]
    assert list(first[1].data) == [0.0, 1.0] and q.depth == 3
    one, rest = q.take(1), q.take(8)
    assert (one[0].index, one[0].rows, one[0].data) == (2, 1, 2.0)  # a lone row is a row
    assert [(i.index, i.rows, list(i.data)) for i in rest] == [(3, 2, [3.0, 4.0])]
    assert q.depth == 0 and q.head() is None


async def test_depth_counts_staged_items_so_the_capacity_holds() -> None:
    q = ModelQueue(capacity=2)
    q.open()
    for item in items(2):
        q.put(item)
    q.head()  # one item moves to the staging area
    assert q.depth == 2


async def test_a_shut_down_queue_still_gives_what_it_holds() -> None:
    q = ModelQueue(capacity=4)
    q.open()
    for item in items(2):
        q.put(item)
    q.shutdown()
    assert q.depth == 2
    assert len(q.take(4)) == 2 and q.take(4) == [] and q.depth == 0
    await q.wait_closed()


async def test_two_device_threads_take_each_item_once() -> None:
    q = ModelQueue(capacity=2000)
    q.open()
    for item in items(2000):
        q.put(item)
    taken: list[list[float]] = [[], []]

    def drain(into: list[float]) -> None:
        while batch := q.take(7):
            into.extend(i.data for i in batch)

    threads = [threading.Thread(target=drain, args=(t,)) for t in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken[0] + taken[1]) == [float(i) for i in range(2000)]


async def test_an_urgent_item_overtakes_a_backlog_of_less_urgent_ones() -> None:
    q = ModelQueue(capacity=16, levels=3)
    q.open()
    loop = asyncio.get_running_loop()
    for value, level in ((1.0, 3), (2.0, 3), (3.0, 2), (4.0, 1), (5.0, 3), (6.0, 1)):
        q.put(PendingItem(PendingRequest(loop.create_future(), 1, 1e9, 0.0, level), 0, value))
    assert q.depth == 6 and q.depth_through(1) == 2 and q.depth_through(2) == 3
    assert q.head().data == 4.0  # type: ignore[union-attr]
    assert [i.data for i in q.take(3)] == [4.0, 6.0, 3.0]  # level 1, then 2, in arrival order
    assert q.depth_through(1) == 0 and q.depth == 3
    assert [i.data for i in q.take(9)] == [1.0, 2.0, 5.0]


def texts(q: ModelQueue, *specs: tuple[int, int, float]) -> None:
    """Items of (length, level, deadline); the data is an array of that many tokens."""
    loop = asyncio.get_running_loop()
    for length, level, deadline in specs:
        request = PendingRequest(loop.create_future(), 1, deadline, 0.0, level)
        q.put(PendingItem(request, 0, [0] * length))


def lengths_of(items: list[PendingItem]) -> list[int]:
    return [len(i.data) for i in items]


async def test_a_batch_gathers_the_lengths_closest_to_the_oldest_item() -> None:
    q = ModelQueue(capacity=32)
    q.open()
    texts(q, *[(n, 1, 1e9) for n in (20, 150, 18, 160, 22, 19, 140, 21)])
    first = q.take_similar(4, len, 64, None, due=0.0)
    assert lengths_of(first) == [20, 18, 19, 21]  # the oldest and the 3 closest, by age
    assert lengths_of(q.take_similar(4, len, 64, None, due=0.0)) == [150, 160, 22, 140]
    assert q.depth == 0


async def test_the_window_and_the_token_budget_bound_the_batch() -> None:
    q = ModelQueue(capacity=32)
    q.open()
    texts(q, *[(n, 1, 1e9) for n in (20, 150, 160, 19, 21)])
    assert lengths_of(q.take_similar(3, len, 3, None, due=0.0)) == [20, 150, 160]  # sees 3
    texts(q, (100, 1, 1e9), (100, 1, 1e9), (100, 1, 1e9))
    # 19, 21, 100 x 3 waiting; 200 padded tokens at most: 21 x 3 fits, a 100 does not join
    assert lengths_of(q.take_similar(8, len, 64, 200, due=0.0)) == [19, 21]
    assert lengths_of(q.take_similar(8, len, 64, 150, due=0.0)) == [100]  # alone, whatever size


async def test_urgent_levels_then_items_near_their_deadline_come_first() -> None:
    q = ModelQueue(capacity=32, levels=2)
    q.open()
    texts(q, (20, 2, 1e9), (150, 2, 5.0), (21, 2, 1e9), (160, 1, 1e9))
    batch = q.take_similar(3, len, 64, None, due=10.0)
    assert lengths_of(batch) == [160, 150, 21]  # level 1; the item due before 10; the closest


async def test_a_batch_being_filled_keeps_its_length_and_budget() -> None:
    q = ModelQueue(capacity=32)
    q.open()
    texts(q, (20, 1, 1e9), (118, 1, 1e9), (119, 1, 1e9))
    # two items of up to 120 tokens are in the batch already; 400 padded tokens at most
    more = q.take_similar(2, len, 64, 400, due=0.0, anchor=120, held=(2, 120))
    assert lengths_of(more) == [119]  # the closest; 3 x 120 = 360 fits, a fourth (480) not
