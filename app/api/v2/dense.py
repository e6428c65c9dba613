"""A v2 JSON request for a model whose input is floating-point, parsed with its tensor's data
read by simdjson straight into one float64 array: no Python number is made for it, which is
most of what orjson and numpy's cast cost (``python -m bench.parse``: 1.4 x faster for 512
numbers, 2.4 x for 4,096, 2.7 x for 16 x 512, 3.1 x for 16 x 4,096; a tensor of 4 numbers
costs about 3 us more). /predict's dense path does the same (app/payload.py).

The numbers are read in order, whatever the nesting of their arrays, as Triton reads a JSON
tensor: the shape then says how many there must be. A data array that holds anything but
numbers (a string, a boolean, null) is refused, as Triton refuses it, where numpy's cast read
``"1.5"`` and ``true`` as numbers and null as NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simdjson

from app.models.signature import DATATYPES

FLOATS = frozenset(name for name, dtype in DATATYPES.items() if dtype.kind == "f")

# Stands for data that is not all numbers: numpy casts no object to a number, so the codec's
# ``numbers`` refuses it ("data is not a list of FP32 numbers") once the input's name, shape
# and datatype are checked, as it refuses any other data it cannot read.
NOT_NUMBERS = object()


def dense_payload(body: bytes) -> dict[str, Any] | None:
    """The request as ``json_object`` gives it, but for its one input's ``data``: a flat float64
    array (or ``NOT_NUMBERS``). None where this parse does not apply (not JSON, not an object,
    not one input, data that is no array, a byte order mark, which simdjson skips and JSON does
    not allow, a key that comes twice): the general parse then takes the body, and names what
    is wrong."""
    if body.startswith(b"\xef\xbb\xbf"):
        return None
    try:
        document = simdjson.Parser().parse(body)
        if not isinstance(document, simdjson.Object):
            return None
        payload = _fields(document, "inputs")
        inputs = payload.get("inputs") if payload is not None else None
        if payload is None or not isinstance(inputs, simdjson.Array) or len(inputs) != 1 \
                or not isinstance(inputs[0], simdjson.Object):
            return None
        tensor = _fields(inputs[0], "data")
        data = tensor.get("data") if tensor is not None else None
        if tensor is None or not isinstance(data, simdjson.Array):
            return None
        try:
            tensor["data"] = np.frombuffer(data.as_buffer(of_type="d"), dtype=np.float64)
        except TypeError:  # an element that is no number
            tensor["data"] = NOT_NUMBERS
    # not JSON; a number past float64 or 64-bit integers
    except (ValueError, RuntimeError):
        return None
    payload["inputs"] = [tensor]
    return payload


def _fields(element: Any, lazy: str) -> dict[str, Any] | None:
    """An object's fields as Python values, but ``lazy``'s, left as simdjson's element (its
    ``items`` would make Python values of all). None where a key comes twice (simdjson's lookup
    finds the first, orjson keeps the last) or holds a NUL (simdjson looks up the key cut
    there: ``"\\u0000"`` found ``""``'s value), and the general parse then decides."""
    keys = list(element.keys())
    if len(set(keys)) != len(keys) or any("\0" in key for key in keys):
        return None
    return {key: element[key] if key == lazy else _python(element[key]) for key in keys}


def _python(value: Any) -> Any:
    """A parsed value as the Python objects orjson would give."""
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value
