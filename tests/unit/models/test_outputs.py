"""Model outputs on the device side: splitting them into per-item results."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.models.outputs import OutputCountMismatch, split_rows


def test_rows_of_outputs_that_are_not_contiguous_are() -> None:
    """Transposed or expanded outputs (a model may return either) come back as C-contiguous
    rows, which /predict renders as JSON."""
    for outputs in (torch.arange(6.0).reshape(2, 3).t(), torch.ones(1, 4).expand(3, 4)):
        rows = split_rows(outputs, 3)
        assert all(row.flags.c_contiguous for row in rows)
        assert [row.tolist() for row in rows] == outputs.tolist()


def test_bfloat16_rows_come_as_float32() -> None:
    outputs = torch.tensor([[1.5, -2.0], [3.0, 0.25]], dtype=torch.bfloat16)
    rows = split_rows(outputs, 2)
    assert rows[0].dtype == np.float32 and [r.tolist() for r in rows] == outputs.float().tolist()


def test_split_rows_checks_the_count() -> None:
    assert len(split_rows(torch.zeros(3, 2), 3)) == 3
    assert split_rows({"a": torch.zeros(2, 1)}, 2)[1]["a"].shape == (1,)
    with pytest.raises(OutputCountMismatch):
        split_rows(torch.zeros(2, 2), 3)
    with pytest.raises(OutputCountMismatch):
        split_rows(torch.tensor(1.0), 1)
