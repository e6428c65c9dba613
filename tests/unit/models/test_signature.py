"""Naming a model's tensors: datatypes, and outputs learned from per-item results."""

from __future__ import annotations

import numpy as np
import pytest

from app.models.signature import (
    TensorSpec,
    datatype_of,
    describe_outputs,
    output_columns,
    output_tensors,
)


def test_datatypes_follow_the_protocol() -> None:
    assert datatype_of(np.zeros(2, np.float32)) == "FP32"
    assert datatype_of(np.zeros(2, ">i8")) == "INT64"  # byte order does not matter
    assert datatype_of(np.array(["a"])) == "BYTES"
    with pytest.raises(ValueError, match="no v2 datatype"):
        datatype_of(np.zeros(2, np.complex64))


def test_outputs_are_named_by_shape_of_the_result() -> None:
    assert list(output_columns(np.zeros(2))) == ["OUTPUT0"]
    assert list(output_columns((np.zeros(2), np.zeros(3)))) == ["OUTPUT0", "OUTPUT1"]
    assert list(output_columns({"scores": 1, "label": 2})) == ["scores", "label"]


def test_describe_outputs_merges_items() -> None:
    results = [
        {"emb": np.zeros((3, 8), np.float32), "n": np.int64(3)},
        {"emb": np.zeros((5, 8), np.float32), "n": np.int64(5)},
    ]
    assert describe_outputs(results) == [
        TensorSpec("emb", "FP32", (-1, 8)),  # the dimension that varies is -1
        TensorSpec("n", "INT64", ()),
    ]
    assert describe_outputs([np.zeros(2, np.float32)]) == [TensorSpec("OUTPUT0", "FP32", (2,))]


def test_output_tensors_stack_per_item_results_and_take_a_block_as_it_is() -> None:
    rows = [np.arange(3, dtype=np.float32) + i for i in range(2)]
    stacked = output_tensors(rows)
    assert list(stacked) == ["OUTPUT0"]
    np.testing.assert_array_equal(stacked["OUTPUT0"], np.stack(rows))
    named = output_tensors([{"a": r, "b": r[:1]} for r in rows])
    assert named["b"].shape == (2, 1)
    block = np.stack(rows)  # a request's rows computed together
    assert output_tensors(block)["OUTPUT0"] is block
