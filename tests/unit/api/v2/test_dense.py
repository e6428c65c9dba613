"""app/api/v2/dense.py: a float input's JSON request parsed as orjson parses it, its data read
straight into an array, or left to the general parse."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.v2.codec import parse_request
from app.api.v2.dense import NOT_NUMBERS, dense_payload
from app.errors import InvalidInput
from app.models.signature import TensorSpec

SPEC = TensorSpec("INPUT0", "FP32", (2,))


def body(data: Any, **tensor: Any) -> bytes:
    return json.dumps({"id": "r", "inputs": [{"name": "INPUT0", "shape": [2, 2],
                                              "datatype": "FP32", "data": data, **tensor}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
                       "parameters": {"priority": 1}}).encode()


def test_the_data_is_one_flat_array_and_the_rest_as_orjson_gives_it() -> None:
    raw = body([[1.5, -2], [3e-3, 4]], parameters={"x": [1, None]})
    payload = dense_payload(raw)
    assert payload is not None
    data = payload["inputs"][0].pop("data")
    assert data.dtype == np.float64 and data.tolist() == [1.5, -2.0, 3e-3, 4.0]
    expected = orjson.loads(raw)
    del expected["inputs"][0]["data"]
    assert payload == expected


@pytest.mark.parametrize("data", [[1, 2, "3", 4], [1, 2, True, 4], [1, 2, None, 4],
                                  [[1, 2], [3, {}]]])
def test_data_that_is_not_all_numbers_is_refused_as_triton_refuses_it(data: list) -> None:
    """numpy's cast read "3" and true as numbers, and null as NaN."""
    payload = dense_payload(body(data))
    assert payload is not None and payload["inputs"][0]["data"] is NOT_NUMBERS
    with pytest.raises(InvalidInput, match="^input 'INPUT0': data is not a list of FP32 numbers$"):
        parse_request(body(data), None, 16, "m", SPEC)


def test_the_numbers_are_read_in_order_whatever_their_nesting() -> None:
    """As Triton reads a JSON tensor: the shape says how many there must be."""
    for data in ([1, 2, 3, 4], [[1, 2], [3, 4]], [[1, 2, 3], [4]], [[[1]], 2, [3, [4]]]):
        rows = parse_request(body(data), None, 16, "m", SPEC).rows
        assert [r.tolist() for r in rows] == [[1, 2], [3, 4]]
    with pytest.raises(InvalidInput, match="3 values do not fill shape"):
        parse_request(body([[1, 2], [3]]), None, 16, "m", SPEC)


@pytest.mark.parametrize("raw", [
    b'\xef\xbb\xbf{"inputs": [{"data": [1]}]}',  # a byte order mark: orjson refuses it
    b'{"inputs": [{"data": [1], "data": [2]}]}',  # twice: orjson keeps the last
    b'{"inputs": [{"data": [1]}], "inputs": []}',
    b'{"inputs": [{"data": 5}]}', b'{"inputs": [{"name": "INPUT0"}]}', b'{"inputs": []}',
    b'{"inputs": [{"data": [1]}, {"data": [2]}]}', b'{"inputs": {}}', b"[1]", b"", b"{",
    b'{"inputs": [{"data": [1e400]}]}', b'{"inputs": [{"data": [1]}], "x": 1' + b"0" * 30 + b"}",
    b'{"\\u0000": 1, "inputs": [{"data": [1]}]}',  # simdjson cannot look a NUL key up
    b'{"inputs": [{"": null, "\\u0000": [], "data": [1]}]}',  # ... and finds ""'s value
    b'{"inputs": [{"data": [1]}]} x', b'{"inputs": [{"data": ["\xff"]}]}',
])
def test_what_this_parse_does_not_take_is_left_to_the_general_one(raw: bytes) -> None:
    assert dense_payload(raw) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False,
                                                                          allow_infinity=False)
    | st.text(), lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                            max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(extra=st.dictionaries(st.text(), JSON, max_size=3),
       tensor=st.dictionaries(st.text(), JSON, max_size=3), data=JSON)
def test_any_request_is_parsed_as_orjson_parses_it_or_left_to_it(
        extra: dict[str, Any], tensor: dict[str, Any], data: Any) -> None:
    raw = orjson.dumps({**extra, "inputs": [{**tensor, "data": data}]})
    payload = dense_payload(raw)
    if payload is None:
        return
    expected = orjson.loads(raw)
    got = payload["inputs"][0].pop("data")
    want = expected["inputs"][0].pop("data")
    assert payload == expected
    if got is NOT_NUMBERS:
        assert isinstance(want, list) and not _all_numbers(want)
    else:
        assert _all_numbers(want) and got.tolist() == [float(v) for v in _flat(want)]


def _flat(value: Any) -> list[Any]:
    return [x for v in value for x in _flat(v)] if isinstance(value, list) else [value]


def _all_numbers(value: Any) -> bool:
    return all(type(v) in (int, float) for v in _flat(value))
