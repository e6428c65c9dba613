"""Stacking many small numpy arrays, the way the hot paths need it (a batch's rows, a message's
items)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# A request's results, one an instance: a list, or where its rows were computed together, their
# array (one block; its rows are the results).
Results = Sequence[Any] | np.ndarray


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
    return np.concatenate(rows).reshape(len(rows), *rows[0].shape)
