"""stack_rows is np.stack, faster."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from app.arrays import concat_held, copy_held, join_rows, listed_rows, stack_rows


@pytest.mark.parametrize("rows", [
    [np.arange(4, dtype=np.float32) + i for i in range(300)],
    [np.arange(6, dtype=np.int64).reshape(2, 3) * i for i in range(3)],
    [np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1]] * 2,  # strided views
    [np.float32(1.0), np.float32(2.0)],  # scalars: np.stack's own way
    [np.ones(3, dtype=np.float32), np.ones(3, dtype=np.float64)],  # promoted as np.stack does
    # rows numpy would copy letting the GIL go: copied holding it (concat_held)
    [np.arange(600, dtype=np.float32) * i for i in range(5)],
    [np.ones(600, dtype=np.float32), np.ones(600, dtype=np.float64)],
])
def test_it_is_np_stack(rows: list[np.ndarray]) -> None:
    got, want = stack_rows(rows), np.stack(rows)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def test_rows_of_different_shapes_are_refused_as_np_stack_refuses_them() -> None:
    """Three rows of 3, 2 and 4 numbers hold 9 = 3 x 3: a reshape alone would take them."""
    with pytest.raises(ValueError, match="same shape"):
        stack_rows([np.ones(3), np.ones(2), np.ones(4)])


@pytest.mark.parametrize("items", [
    [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32),
     np.zeros((1, 3), np.float32)],
    [np.ones(3, np.float32), np.ones((2, 3), np.float64)],  # promoted as numpy promotes
    [np.float32(1.0), np.arange(2, dtype=np.float32)],  # scalars and a chunk of them
])
def test_join_rows_is_concatenate_with_rows_as_chunks_of_one(items: list[np.ndarray]) -> None:
    rank = 0 if items[0].ndim == 0 else 1
    want = np.concatenate([i if i.ndim > rank else i[None] for i in items])
    got = join_rows(items, rank)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def test_join_rows_refuses_rows_of_another_shape_as_concatenate_does() -> None:
    """A row of 2 and one of 4 hold 6 = 2 x 3: sizes alone would take them."""
    with pytest.raises(ValueError, match="dimension"):
        join_rows([np.ones((1, 3)), np.ones(2), np.ones(4)], 1)


def test_concat_held_says_where_numpy_must_copy() -> None:
    out = np.zeros(6, np.float32)
    assert concat_held(out, [np.ones((2, 2), np.float32), np.full(2, 2, np.float32)])
    assert out.tolist() == [1, 1, 1, 1, 2, 2]
    assert not concat_held(out, [np.ones(6, np.float64)])  # another dtype
    assert not concat_held(out, [np.ones(4, np.float32)])  # too few
    assert not concat_held(out, [np.ones(4, np.float32)] * 2)  # too many


def test_copy_held_is_a_copy() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    for source in (array, array[:, 1:3]):  # contiguous, and a strided view
        got = copy_held(source)
        assert np.array_equal(got, source) and not np.shares_memory(got, source)
        assert got.flags.c_contiguous


def test_the_copies_keep_the_gil() -> None:
    """numpy lets the GIL go to copy each part of more than 500 elements; these must not, so
    a thread waiting for the GIL never runs while they copy. (The switch interval is long
    enough that it cannot take the GIL by asking for it in that time.)"""
    parts = [np.full(32_768, i, np.float32) for i in range(32)]
    out = np.empty(32 * 32_768, np.float32)
    ran = [0]
    stop = threading.Event()

    def other() -> None:
        while not stop.is_set():
            ran[0] += 1
            time.sleep(0)  # let the GIL go: the copying thread gets it back at once

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    waiter = threading.Thread(target=other)
    waiter.start()
    try:
        for _ in range(5):
            time.sleep(0.005)  # the waiter runs; then it waits for the GIL
            before = ran[0]
            assert concat_held(out, parts)
            assert copy_held(out) is not out
            assert ran[0] == before
    finally:
        stop.set()
        waiter.join()
        sys.setswitchinterval(interval)
    assert np.array_equal(out.reshape(32, -1)[:, 0], np.arange(32))


@pytest.mark.parametrize("shape", [(0, 3), (1, 3), (7, 3), (8, 3), (9, 3), (2, 4, 5)])
def test_listed_rows_are_the_arrays_rows_as_views(shape: tuple[int, ...]) -> None:
    """By index below eight rows, by iteration from there: the rows ``list`` gives."""
    array = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    rows = listed_rows(array)
    assert type(rows) is list and len(rows) == shape[0]
    for row, expected in zip(rows, list(array), strict=True):
        assert row.shape == shape[1:] and np.array_equal(row, expected)
        assert np.shares_memory(row, array)
