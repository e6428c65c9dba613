"""Property tests of every decoder a client's bytes reach: whatever comes in, the answer is a
valid decoded value or a ServeError (422/413) with a message; never another exception.

Covers app/payload.py, the tensor and text handlers' ``decode`` and app/api/v2/codec.py's parser.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.api.v2.codec import parse_request
from app.errors import InvalidInput, PayloadTooLarge, ServeError
from app.models.builtin import linear_handler
from app.models.signature import DATATYPES, TensorSpec
from app.models.tensor import TensorHandler
from app.payload import DenseRows, dense_instances, instances_of, may_hold_booleans, parse_json

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8) | st.binary(max_size=4)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=40,
)
numbers = st.integers() | st.floats(allow_nan=True, allow_infinity=True)
# Near-misses of a [4] float vector: other lengths, ragged rows, huge / non-finite numbers.
vectors = st.lists(numbers, min_size=0, max_size=6) | st.lists(
    st.lists(numbers, max_size=3), max_size=4
)


def dumps(value: Any) -> bytes:
    """JSON text as a client might send it: huge integers and NaN/Infinity tokens included."""
    return json.dumps(value, default=repr).encode()


def nested(depth: int) -> Any:
    value: Any = 1.0
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture(scope="module")
def linear() -> TensorHandler:
    return linear_handler()


@SETTINGS
@given(body=st.binary(max_size=200) | json_values.map(dumps))
@example(body=b"[" * 100_000)
@example(body=b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}")
@example(body=b"\xff\xfe")
@example(body=b'{"instances": [NaN]}')
def test_parse_json_never_crashes(body: bytes) -> None:
    try:
        payload = parse_json(body)
    except InvalidInput as exc:
        assert exc.message
        return
    try:
        instances = instances_of(payload, max_instances=4)
    except (InvalidInput, PayloadTooLarge) as exc:
        assert exc.message
        return
    assert isinstance(instances, list) and 1 <= len(instances) <= 4


# Near-misses of flat instances of 3 numbers: other lengths, an array where a number belongs and
# the reverse, booleans, nulls, strings, numbers beyond float64.
near_values = numbers | st.booleans() | st.none() | st.just("1") | st.lists(numbers, max_size=2)
near_instances = st.lists(st.lists(near_values, max_size=4) | near_values, max_size=5)


def general_path(body: bytes, max_instances: int) -> list[Any] | None:
    """What ``parse_json`` and ``instances_of`` give for ``body``; None where they refuse it."""
    try:
        return instances_of(parse_json(body), max_instances)
    except (InvalidInput, PayloadTooLarge):
        return None


@SETTINGS
@given(body=near_instances.map(lambda xs: dumps({"instances": xs})) | json_values.map(dumps)
       | st.binary(max_size=40))
@example(body=b'{"instances": [[1, [2], 3]]}')  # as many numbers as [1, 2, 3]
@example(body=b'{"instances": [[1, 2, 3, 4], [5, 6]]}')  # as many as two rows
@example(body=b'{"instances": [[1, 2, 3]], "note": "[x]"}')
@example(body=b'\xef\xbb\xbf{"instances": [[1, 2, 3]]}')
@example(body=b'{"instances": [[1, 2, -9223372036854775809]]}')
@example(body=b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}")  # beyond simdjson's depth
def test_dense_instances_agree_with_the_json_path(body: bytes) -> None:
    """Where the simdjson path takes a body, the general one reads the same numbers from it;
    everything else it leaves to the general one."""
    dense = dense_instances(body, 3, max_instances=4)
    if dense is None:
        return
    instances = general_path(body, max_instances=4)
    assert instances is not None and len(instances) == len(dense)
    for row, instance in zip(dense, instances, strict=True):
        assert row.dtype == np.float32 and row.shape == (3,) and np.isfinite(row).all()
        assert type(instance) is list and not any(type(v) is bool for v in instance)
        assert np.array_equal(row, np.asarray(instance, dtype=np.float64).astype(np.float32))


@pytest.mark.parametrize("instances", [
    [[1, 2.5, -3e2]],
    [[0, -0.0, 1e-300], [4, 5, 6], [7, 8, 9], [3.4e38, -3.4e38, 9223372036854775808]],
])
def test_dense_instances_take_flat_numbers(instances: list[Any]) -> None:
    for body in (dumps({"instances": instances}), dumps({"x": {"y": 1}, "instances": instances})):
        dense = dense_instances(body, 3, max_instances=4)
        assert dense is not None
        assert np.array_equal(np.stack(dense), np.asarray(instances, dtype=np.float32))


def test_dense_rows_of_an_array_are_its_rows() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    rows = DenseRows.of(array)
    assert type(rows) is DenseRows and [r.tolist() for r in rows] == array.tolist()


def test_a_tensor_model_takes_dense_rows_as_they_are(linear: TensorHandler) -> None:
    """They are float32 and checked already; the general path gives the same rows."""
    instances = [[float(i) * 0.37 - 50 for i in range(100)], [1e-30] * 100]
    wide = TensorHandler("wide", lambda d: None, (100,))  # type: ignore[arg-type,return-value]
    dense = dense_instances(dumps({"instances": instances}), 100, max_instances=4)
    assert dense is not None
    assert wide.decode(dense) is dense
    assert np.array_equal(np.stack(dense), np.stack(wide.decode(instances)))
    # Rows of another width are no tensor model's to take as they are: decoded as numbers.
    with pytest.raises(InvalidInput, match=r"^instances\[0\]"):
        linear.decode(dense)


@pytest.mark.parametrize("body", [
    b'{"instances": [[1, 2, 3]]} x', b'{"instances": [[1, 2, 3],]}', b'{"instances": []}',
    b'{"instances": [[1, 2, NaN]]}', b'{"instances": [[1, 2, 1e400]]}',
    b'{"instances": [[1, 2, 1e39]]}', b'{"instances": [[-3.5e38, 2, 3]]}',  # past float32
    b'{"instances": [[1, 2, true]]}', b'{"instances": [[1, 2, null]]}',
    b'{"instances": [[1, 2, "3"]]}', b'{"instances": [[1, 2, {}]]}',
    b'{"instances": [[1, 2]]}', b'{"instances": [1, 2, 3]}', b'[[1, 2, 3]]',
    b'{"inputs": [[1, 2, 3]]}', b"", b"\xff",
    dumps({"instances": [[1, 2, 3]] * 5}),  # more than max_instances: the general path's 413
])
def test_dense_instances_leave_everything_else_to_the_json_path(body: bytes) -> None:
    assert dense_instances(body, 3, max_instances=4) is None


@SETTINGS
@given(value=json_values)
def test_a_body_with_true_or_false_may_hold_booleans(value: Any) -> None:
    """Never a false "no": the general path looks for booleans only where this says so."""
    body = dumps(value)
    if b"true" in body or b"false" in body:
        assert may_hold_booleans(body)


def test_numbers_hold_no_booleans() -> None:
    assert not may_hold_booleans(dumps({"instances": [[1, -2.5e-3, 1e300, 0]]}))


@SETTINGS
@given(instances=st.lists(vectors | json_values, min_size=1, max_size=5))
@example(instances=[[1, 2, 3, 4]])
@example(instances=[[1, 2, 3, float("nan")]])
@example(instances=[[1, 2, 3, float("inf")]])
@example(instances=[[1, 2, 3, 10**400]])
@example(instances=[[1, 2, 3, 1e39]])  # finite in float64, infinite in float32
@example(instances=[[1, 2, 3, True]])
@example(instances=[[[1, 2], [3]]])
@example(instances=[nested(100)])
@example(instances=["1234"])
def test_tensor_decode_gives_finite_float32_rows_or_422(
    linear: TensorHandler, instances: list[Any]
) -> None:
    try:
        items = linear.decode(instances)
    except InvalidInput as exc:
        assert exc.message.startswith("instances[")
        return
    assert len(items) == len(instances)
    for item, instance in zip(items, instances, strict=True):
        assert item.dtype == np.float32 and item.shape == (4,)
        assert np.isfinite(item).all()
        assert np.array_equal(item, np.asarray(instance, dtype=np.float32))


@SETTINGS
@given(instances=st.lists(json_values, min_size=1, max_size=5))
@example(instances=[[1, 2]])
def test_shapeless_decode_gives_finite_float32_or_422(instances: list[Any]) -> None:
    handler = TensorHandler("free", lambda d: None, None)  # type: ignore[arg-type,return-value]
    try:
        items = handler.decode(instances)
    except InvalidInput as exc:
        assert exc.message.startswith("instances[")
        return
    for item in items:
        assert item.dtype == np.float32 and np.isfinite(item).all()


@pytest.mark.parametrize("shape", [(4,), None])
def test_nesting_too_deep_for_the_stack_is_422(shape: tuple[int, ...] | None) -> None:
    """A plain test, not an @example: hypothesis prints each explicit example, and its printer
    can overflow its recursion on a list nested 10,000 deep."""
    handler = TensorHandler("t", lambda d: None, shape)  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidInput, match=r"^instances\[0\]: .*too deep"):
        handler.decode([nested(10_000)])


@pytest.mark.slow
@SETTINGS
@given(instances=st.lists(json_values, min_size=1, max_size=5))
@example(instances=["", "a" * 5000, "naïve ☃"])
def test_text_decode_takes_strings_only(instances: list[Any]) -> None:
    handler = _minilm()
    try:
        items = handler.decode(instances)
    except InvalidInput as exc:
        assert not all(isinstance(x, str) for x in instances)
        assert "expected a string" in exc.message
        return
    assert all(isinstance(x, str) for x in instances)
    assert all(item.dtype == np.int64 and 2 <= len(item) <= 256 for item in items)


_MINILM: list[Any] = []


def _minilm() -> Any:
    if not _MINILM:
        from app.models.minilm import MiniLMHandler

        _MINILM.append(MiniLMHandler())
    return _MINILM[0]


shapes = st.lists(st.integers(min_value=-2, max_value=2**70), min_size=0, max_size=4) | st.lists(
    st.integers(min_value=0, max_value=4), min_size=1, max_size=3
)
v2_inputs = st.fixed_dictionaries(
    {"name": st.just("INPUT0") | scalars,
     "shape": shapes | json_values,
     "datatype": st.sampled_from([*DATATYPES, "BYTES", "FP8", ""]) | scalars},
    optional={"data": json_values | st.lists(numbers, max_size=12),
              "parameters": st.fixed_dictionaries({"binary_data_size": st.integers(-1, 64)})
              | json_values},
)
v2_payloads = st.fixed_dictionaries(
    {"inputs": st.lists(v2_inputs, min_size=1, max_size=2) | json_values},
    optional={"outputs": json_values, "parameters": json_values, "id": json_values},
)


# The model's one input as the parser is told it: undeclared shape (element counts come from the
# request alone), a declared [4], a text input.
v2_specs = st.sampled_from([
    TensorSpec("INPUT0", "FP32", None), TensorSpec("INPUT0", "FP32", (4,)),
    TensorSpec("INPUT0", "INT64", (-1, 2)), TensorSpec("INPUT0", "BYTES", (1,)),
])
v2_outputs = st.none() | st.just([TensorSpec("OUTPUT0", "FP32", (2,))])
OVERFLOW = [1, 4294967296, 4294967296]  # 2**64 elements: np.prod wraps to 0


@SETTINGS
@given(payload=v2_payloads, binary=st.binary(max_size=64), header=st.booleans(), spec=v2_specs,
       outputs=v2_outputs)
@example(payload={"inputs": [{"name": "INPUT0", "shape": [1, 2**62, 4], "datatype": "FP32",
                              "data": [1.0]}]}, binary=b"", header=False,
         spec=TensorSpec("INPUT0", "FP32", None), outputs=None)
@example(payload={"inputs": [{"name": "INPUT0", "shape": OVERFLOW, "datatype": "FP32",
                              "data": []}]}, binary=b"", header=False,
         spec=TensorSpec("INPUT0", "FP32", None), outputs=None)
@example(payload={"inputs": [{"name": "INPUT0", "shape": OVERFLOW, "datatype": "FP32",
                              "parameters": {"binary_data_size": 0}}]}, binary=b"", header=True,
         spec=TensorSpec("INPUT0", "FP32", None), outputs=None)
@example(payload={"inputs": [{"name": "INPUT0", "shape": OVERFLOW, "datatype": "BYTES",
                              "parameters": {"binary_data_size": 0}}]}, binary=b"", header=True,
         spec=TensorSpec("INPUT0", "BYTES", (1,)), outputs=None)
@example(payload={"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                              "data": [1e300, 1.0]}]}, binary=b"", header=False,
         spec=TensorSpec("INPUT0", "FP32", None), outputs=None)  # beyond FP32: a 400, no warning
@example(payload={"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES",
                              "parameters": {"binary_data_size": 8}}]},
         binary=b"\x04\x00\x00\x00\xff\xfe\xfd\xfc", header=True,
         spec=TensorSpec("INPUT0", "BYTES", (1,)), outputs=None)
def test_v2_parse_never_crashes(payload: dict[str, Any], binary: bytes, header: bool,
                                spec: TensorSpec, outputs: list[TensorSpec] | None) -> None:
    json_part = dumps(payload)
    body = json_part + binary if header else json_part
    length = str(len(json_part)) if header else None
    try:
        request = parse_request(body, length, 8, "m", spec, outputs)
    except ServeError as exc:
        assert exc.status in (413, 422) and exc.message
        return
    assert 1 <= len(request.rows) <= 8
    tensor = payload["inputs"][0]
    assert tensor["name"] == spec.name and tensor["datatype"] == spec.datatype


@SETTINGS
@given(body=st.binary(max_size=64), length=st.text(max_size=6) | st.none())
@example(body=b"", length="\u00b2")  # "²".isdigit() is True, int("²") raises
@example(body=b"{}", length="\u0663")  # Arabic-Indic three: int() takes it, we do not
def test_v2_parse_raw_bytes(body: bytes, length: str | None) -> None:
    try:
        parse_request(body, length, 8, "m", TensorSpec("INPUT0", "FP32", None))
    except ServeError as exc:
        assert exc.status in (413, 422)
