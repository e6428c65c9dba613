"""TensorHandler: decoding and validation of numeric instances, batching by shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.errors import InvalidInput
from app.models.builtin import linear_module
from app.models.registry import load_handler
from app.models.tensor import TensorHandler


@pytest.fixture
def handler() -> TensorHandler:
    return load_handler("linear")  # type: ignore[return-value]


def test_linear_is_deterministic(handler: TensorHandler) -> None:
    a = handler.load(torch.device("cpu"))
    b = handler.load(torch.device("cpu"))
    x = handler.collate(handler.decode([[1, 2, 3, 4]]))
    assert torch.equal(a(x), b(x))
    assert torch.allclose(a(x), linear_module()(x))


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        ([1, 2, 3], r"expected shape \[4\], got \[3\]"),
        ("text", "got a string"),
        (None, "got null"),
        (True, "got bool"),
        ({"a": 1}, "got dict"),
        ([1, 2, "x", 4], "non-numbers"),
        ([1, 2, None, 4], "ragged lists, nulls"),
        ([[1, 2], [3]], "ragged"),
        ([1, 2, 3, 1e39], "finite and within float32"),
        ([1, 2, 3, 10**400], "out of range"),
    ],
)
def test_bad_instances_are_named(handler: TensorHandler, instance: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as info:
        handler.decode([[0, 0, 0, 0], instance])
    assert "instances[1]" in info.value.message


def test_deep_nesting_is_refused_not_crashed(handler: TensorHandler) -> None:
    deep: object = 1.0
    for _ in range(100):
        deep = [deep]
    with pytest.raises(InvalidInput):
        handler.decode([deep])


def test_valid_batch_decodes_to_float32_rows(handler: TensorHandler) -> None:
    items = handler.decode([[1, 2, 3, 4], [0.5, 0, 0, 0]])
    assert [i.dtype for i in items] == [np.float32, np.float32]
    assert items[1].tolist() == [0.5, 0, 0, 0]


def test_rows_and_chunks_of_rows_collate_into_one_batch_in_order(handler: TensorHandler) -> None:
    """A model of one input shape stacks: chunks (several rows in one array, app/pending.py)
    and rows collate into the batch they would make row by row."""
    assert handler.stacks
    rows = np.arange(20, dtype=np.float32).reshape(5, 4)
    batch = handler.collate([rows[0], rows[1:3], rows[3], rows[4:]])
    assert torch.equal(batch, torch.from_numpy(rows))
    assert torch.equal(handler.collate(list(rows)), torch.from_numpy(rows))


def test_shapeless_module_batches_by_shape() -> None:
    h = TensorHandler.from_module("double", torch.nn.Identity())
    items = h.decode([[1.0, 2.0], [[1.0]], [3.0, 4.0]])
    assert h.key(items[0]) == h.key(items[2]) != h.key(items[1])
    assert h.examples() == [] and not h.stacks  # its rows' shapes may differ


def test_shape_inferred_from_example() -> None:
    module = torch.nn.Linear(3, 1)
    module.example_inputs = [[1.0, 2.0, 3.0]]  # type: ignore[assignment]
    h = TensorHandler.from_module("m", module)
    assert h.input_shape == (3,)
    with pytest.raises(InvalidInput, match="expected shape"):
        h.decode([[1.0]])
