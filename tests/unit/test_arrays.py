"""stack_rows is np.stack, faster."""

from __future__ import annotations

import numpy as np
import pytest

from app.arrays import stack_rows


@pytest.mark.parametrize("rows", [
    [np.arange(4, dtype=np.float32) + i for i in range(300)],
    [np.arange(6, dtype=np.int64).reshape(2, 3) * i for i in range(3)],
    [np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1]] * 2,  # strided views
    [np.float32(1.0), np.float32(2.0)],  # scalars: np.stack's own way
    [np.ones(3, dtype=np.float32), np.ones(3, dtype=np.float64)],  # promoted as np.stack does
])
def test_it_is_np_stack(rows: list[np.ndarray]) -> None:
    got, want = stack_rows(rows), np.stack(rows)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def test_rows_of_different_shapes_are_refused_as_np_stack_refuses_them() -> None:
    """Three rows of 3, 2 and 4 numbers hold 9 = 3 x 3: a reshape alone would take them."""
    with pytest.raises(ValueError, match="same shape"):
        stack_rows([np.ones(3), np.ones(2), np.ones(4)])
