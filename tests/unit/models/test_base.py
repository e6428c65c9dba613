"""The handler contract's helpers: splitting outputs into per-item results."""

from __future__ import annotations

import pytest
import torch

from app.models.base import OutputCountMismatch, split_rows


def test_split_rows_checks_the_count() -> None:
    assert len(split_rows(torch.zeros(3, 2), 3)) == 3
    assert split_rows({"a": torch.zeros(2, 1)}, 2)[1]["a"].shape == (1,)
    with pytest.raises(OutputCountMismatch):
        split_rows(torch.zeros(2, 2), 3)
    with pytest.raises(OutputCountMismatch):
        split_rows(torch.tensor(1.0), 1)
