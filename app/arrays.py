"""Stacking many small numpy arrays, the way the hot paths need it (a batch's rows, a message's
items): fast, and holding the GIL where numpy would let it go once an array (``concat_held``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# numpy lets the GIL go to copy an array of more elements than this (NPY_BEGIN_THREADS_THRESHOLDED).
NUMPY_HOLDS_GIL = 500

# A request's results, one an instance: a list, or where its rows were computed together, their
# array (one block; its rows are the results).
Results = Sequence[Any] | np.ndarray


def listed_rows(array: np.ndarray) -> list[np.ndarray]:
    """``list(array)``, its rows. An ndarray lists its rows by index until an IndexError, whose
    message numpy formats: below eight rows that costs more than the rows (one row: 0.85
    against 0.53 us), so those are taken by index."""
    n = len(array)
    return [array[i] for i in range(n)] if n < 8 else list(array)


def stack_rows(rows: list[np.ndarray]) -> np.ndarray:
    """``np.stack(rows)``: for arrays of one shape and dtype, one concatenation and a reshape,
    about three times faster for a few hundred small rows (np.stack makes a view of each row
    first). Scalars, or rows whose shapes differ, go to np.stack (and its error)."""
    first = rows[0]
    shape = first.shape
    if not first.ndim or any(row.shape != shape for row in rows):
        return np.stack(rows)
    return stack_alike(rows)


def stack_alike(rows: list[np.ndarray]) -> np.ndarray:
    """``stack_rows`` for rows the caller has checked: one shape, at least one dimension."""
    first = rows[0]
    if first.size <= NUMPY_HOLDS_GIL:  # numpy's own loop is the faster, and keeps the GIL
        return np.concatenate(rows).reshape(len(rows), *first.shape)
    out = np.empty((len(rows), *first.shape), dtype=first.dtype)
    if not concat_held(out.reshape(-1), rows):  # a row of another dtype: numpy promotes
        return np.concatenate(rows).reshape(len(rows), *first.shape)
    return out


def join_rows(items: list[np.ndarray], rank: int) -> np.ndarray:
    """Rows of ``rank`` dimensions and chunks of such rows (one more: app/pending.py) as one
    array of rows, in order: ``np.concatenate`` with each row a chunk of one, holding the GIL
    (``concat_held``) where the items are alike."""
    first = items[0]
    shape = first.shape[first.ndim - rank:]
    rows = 0
    for item in items:
        if item.shape[item.ndim - rank:] != shape:
            break
        rows += len(item) if item.ndim > rank else 1
    else:
        out = np.empty((rows, *shape), dtype=first.dtype)
        if concat_held(out.reshape(-1), items):
            return out
    return np.concatenate([item if item.ndim > rank else item[None] for item in items])


def concat_held(out: np.ndarray, parts: Sequence[np.ndarray]) -> bool:
    """``np.concatenate(parts, out=out)`` for a contiguous 1-D ``out`` (each part flattened)
    without letting the GIL go; False, with ``out`` partly written, at a part it cannot copy
    so (another dtype, or sizes that do not add up), for the caller to ask numpy.

    numpy lets the GIL go to copy any array of more than 500 elements, once a part; a device
    thread must then win it back from a busy event loop each time, up to a switch interval
    (``python -m bench.gil_switch``). A memoryview's copy keeps it."""
    at = 0
    try:
        dst = memoryview(out)  # type: ignore[arg-type]  # numpy's arrays are buffers
        for part in parts:
            if part.ndim != 1:
                part = part.reshape(-1)
            end = at + part.size
            dst[at:end] = part  # type: ignore[call-overload]  # any buffer of dst's format
            at = end
    except (ValueError, TypeError, NotImplementedError):  # a dtype no buffer holds too
        return False
    return at == len(out)


def copy_held(array: np.ndarray) -> np.ndarray:
    """``array.copy()`` (C order), without letting the GIL go (``concat_held``)."""
    out = np.empty(array.shape, dtype=array.dtype)
    if not concat_held(out.reshape(-1), [array]):
        return array.copy()
    return out
