"""Open Inference Protocol v2 (KServe v2 / Triton HTTP) tensors, JSON and binary extension.

Pure functions: bytes in, numpy out and back. A request carries one input tensor whose first
dimension is the batch; each row becomes one item for the same batcher as /predict. Every client
mistake raises InvalidInput (a 400 on the v2 routes) naming what is wrong, as Triton words it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from app.api.v2.checks import check_input, check_outputs, check_served, unknown_output
from app.api.v2.dense import FLOATS, NOT_NUMBERS, dense_payload
from app.errors import InvalidInput
from app.framing import decimal
from app.models.signature import DATATYPES, TensorSpec, datatype_of
from app.payload import DenseRows, json_object, json_text, whole_number_of

HEADER_LENGTH = "inference-header-content-length"


@dataclass
class InferRequest:
    id: str | None
    rows: list[Any]  # one per batch row: a numpy array, or a str for BYTES
    outputs: list[str] | None  # names asked for (None: all)
    binary: dict[str, bool]  # an output's own binary_data choice, where it made one
    binary_all: bool = False  # the request's binary_data_output
    priority: int | None = None  # the request's priority parameter (0: the model's default)
    timeout_us: int | None = None  # its timeout parameter, microseconds (0: the model's own)

    def wants_binary(self, name: str) -> bool:
        """An output's own ``binary_data`` wins over the request's ``binary_data_output``."""
        return self.binary.get(name, self.binary_all)


def parse_request(
    body: bytes, header_length: str | None, max_rows: int, model: str, expected: TensorSpec,
    outputs: list[TensorSpec] | None = None,
) -> InferRequest:
    """Parse an infer request (JSON, or JSON header + binary tensors) for a model whose one input
    is ``expected``; ``outputs`` (if known) are the names a request may ask for."""
    json_part, binary = body, b""
    if header_length is not None:
        json_size = decimal(header_length)
        if json_size is None or json_size > len(body):
            raise InvalidInput("Inference-Header-Content-Length is not a valid length")
        json_part, binary = body[:json_size], body[json_size:]
    dense = dense_payload(body) if header_length is None and expected.datatype in FLOATS \
        else None
    payload = dense if dense is not None else json_object(json_part)
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InvalidInput(
            f"expected 1 input tensor in 'inputs' for model '{model}' ({expected.name})"
        )
    rows = _rows(inputs[0], binary, max_rows, model, expected)
    names, binary_out = _requested_outputs(payload, model, outputs)
    request_params = payload.get("parameters") or {}
    if not isinstance(request_params, dict):
        raise InvalidInput("'parameters' must be an object")
    binary_all = _flag(request_params, "binary_data_output", "the request") or False
    priority = whole_number_of(request_params.get("priority"), "parameter 'priority'")
    timeout_us = whole_number_of(request_params.get("timeout"), "parameter 'timeout'")
    request_id = payload.get("id")
    if request_id is not None and not isinstance(request_id, str):
        # Triton refuses it too; dropping it would answer without the id the client sent
        raise InvalidInput(f"'id' must be a string, got {json_text(request_id)}")
    return InferRequest(request_id, rows, names, binary_out, binary_all, priority, timeout_us)


def _rows(tensor: dict[str, Any], binary: bytes, max_rows: int, model: str,
          expected: TensorSpec) -> list[Any]:
    name, shape, datatype = check_input(tensor.get("name"), tensor.get("shape"),
                                        tensor.get("datatype"), max_rows, model, expected)
    params = tensor.get("parameters") or {}
    check_served(params, f"input '{name}'")
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size != len(binary):
            raise InvalidInput(f"input '{name}': binary_data_size is {json_text(size)} but the "
                               f"body holds {len(binary)} bytes of binary data")
        array = from_binary(binary, datatype, shape, name)
    elif "data" in tensor:
        if binary:
            raise InvalidInput(f"input '{name}': the body holds {len(binary)} bytes of binary "
                               "data, but the input has no binary_data_size")
        array = _from_json(tensor["data"], datatype, shape, name)
    else:
        raise InvalidInput(f"input '{name}': no 'data' and no binary_data_size")
    return rows_of(array, name, datatype)


def rows_of(array: np.ndarray, name: str, datatype: str) -> list[Any]:
    """A checked input tensor's batch rows: arrays, or strings for BYTES."""
    rows = array.shape[0]
    if datatype == "BYTES":
        return [_text(v, name, i) for i, v in enumerate(array.reshape(rows))]
    if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
        row = int(np.argmin(np.isfinite(array).reshape(rows, -1).all(axis=1)))
        raise InvalidInput(f"input '{name}': row {row} holds a NaN or an infinity")
    # Cast from JSON's or gRPC's typed numbers (binary data is a read-only view of the body):
    # finite float32 rows of their own, which a tensor model's decode takes as they are.
    if array.dtype == np.float32 and array.flags.writeable:
        return DenseRows.of(array)
    return list(array)


def _flag(params: Any, key: str, where: str) -> bool | None:
    """A true-or-false parameter: None where it is absent, a 400 where it is anything else (as
    Triton refuses it), rather than read as false."""
    value = params.get(key) if isinstance(params, dict) else None
    if value is None or isinstance(value, bool):
        return value
    raise InvalidInput(f"{where}: parameter '{key}' must be true or false, got {json_text(value)}")


def _requested_outputs(
    payload: dict[str, Any], model: str, known: list[TensorSpec] | None
) -> tuple[list[str] | None, dict[str, bool]]:
    outputs = payload.get("outputs")
    if outputs is None:
        return None, {}
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise InvalidInput("'outputs' must be a list of objects")
    if not outputs:  # none named: all of them, as Triton answers it (and gRPC cannot tell)
        return None, {}
    names, binary = [], {}
    for out in outputs:
        name = out.get("name")
        if not isinstance(name, str):
            raise InvalidInput("each requested output needs a string 'name'")
        names.append(name)
        params = out.get("parameters") or {}
        check_served(params, f"output '{name}'")
        choice = _flag(params, "binary_data", f"output '{name}'")
        if choice is not None:
            binary[name] = choice
    check_outputs(names, model, known)
    return names, binary


def _from_json(data: Any, datatype: str, shape: list[int], name: str) -> np.ndarray:
    count = math.prod(shape)  # Python ints: a huge shape cannot wrap around
    if datatype == "BYTES":
        flat = np.asarray(data, dtype=object).reshape(-1) if isinstance(data, list) else None
        if flat is None or flat.size != count:
            raise InvalidInput(f"input '{name}': expected {count} strings for shape {shape}")
        return flat.reshape(shape)
    if datatype in FLOATS and type(data) is not np.ndarray and not _only(data, (int, float)):
        data = NOT_NUMBERS  # as the dense parse finds it (a body it left to orjson)
    array = numbers(data, datatype, name)
    if array.size != count:
        raise InvalidInput(f"input '{name}': {array.size} values do not fill shape {shape}")
    return array.reshape(shape)


def _only(data: Any, kinds: tuple[type, ...]) -> bool:
    """Whether JSON ``data`` is a list whose values, nested or not, are all of ``kinds``
    (exactly: a boolean is no int). One value at a time: for the bodies and values numpy's
    inference cannot settle."""
    if type(data) is not list:
        return False
    stack: list[Any] = [data]
    while stack:
        value = stack.pop()
        if type(value) is list:
            stack.extend(value)
        elif type(value) not in kinds:
            return False
    return True


def numbers(values: Any, datatype: str, name: str) -> np.ndarray:
    """``values`` (JSON's list, flat or nested, or a typed protobuf field) as an array of
    ``datatype``, a non-BYTES one. An integer type takes whole numbers only and BOOL true and
    false only, as Triton parses them, where numpy would cut 1.5 to 1 or read 2 as true; a
    value out of the type's range is refused rather than wrapped around."""
    dtype = DATATYPES[datatype]
    try:
        if dtype.kind in "biu" and not _of_kind(values, dtype.kind):
            raise ValueError
        with np.errstate(over="raise", invalid="raise"):
            return np.asarray(values, dtype=dtype)
    except (FloatingPointError, OverflowError):  # an INT8 given 300, an FP16 given 1e5
        raise InvalidInput(f"input '{name}': a number is out of {datatype}'s range") from None
    except (ValueError, TypeError):
        raise InvalidInput(f"input '{name}': data is not a list of {datatype} "
                           f"{'values' if dtype.kind == 'b' else 'numbers'}") from None


def _of_kind(values: Any, kind: str) -> bool:
    """Whether ``values`` are all booleans (kind ``b``) or all integers (``i``, ``u``). numpy's
    inference says at once, but reads integers past int64 beside smaller ones as floats: those
    are then looked at one by one."""
    inferred = np.asarray(values).dtype.kind
    if inferred == kind or (inferred in "iu" and kind != "b") or not np.size(values):
        return True
    return kind != "b" and inferred == "f" and _only(values, (int,))


def from_binary(raw: bytes, datatype: str, shape: list[int], name: str) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        # At most ``count`` elements are read: a body of many empty elements (4 bytes each)
        # would otherwise cost a pass of this loop per 4 bytes before the count is compared.
        values: list[bytes] = []
        offset = 0
        while offset < len(raw) and len(values) < count:
            if offset + 4 > len(raw):
                raise InvalidInput(f"input '{name}': truncated BYTES element")
            (length,) = struct.unpack_from("<I", raw, offset)
            offset += 4
            if offset + length > len(raw):
                raise InvalidInput(f"input '{name}': truncated BYTES element")
            values.append(raw[offset: offset + length])
            offset += length
        if offset != len(raw):
            raise InvalidInput(f"input '{name}': more than {count} elements for shape {shape}")
        if len(values) != count:
            raise InvalidInput(f"input '{name}': {len(values)} elements do not fill shape {shape}")
        return np.asarray(values, dtype=object).reshape(shape)
    dtype = DATATYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise InvalidInput(
            f"input '{name}': {len(raw)} bytes do not hold shape {shape} of {datatype}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _text(value: Any, name: str, row: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"input '{name}' row {row}: not valid UTF-8") from None
    raise InvalidInput(f"input '{name}' row {row}: expected a string")


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def to_binary(array: np.ndarray, datatype: str) -> bytes:
    """Row-major raw data; BYTES elements each prefixed by their 4-byte little-endian length."""
    if datatype == "BYTES":
        parts = [_as_bytes(v) for v in array.reshape(-1)]
        return b"".join(struct.pack("<I", len(p)) + p for p in parts)
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def requested(request: InferRequest, tensors: dict[str, np.ndarray], model: str) -> list[str]:
    """The outputs to answer with, in order: those the request named (all it did not)."""
    names = request.outputs if request.outputs is not None else list(tensors)
    for name in names:
        if name not in tensors:
            raise InvalidInput(unknown_output(name, model, list(tensors)))
    return names


def encode_response(
    model_name: str, version: str, request: InferRequest, tensors: dict[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """(body, header length or None). Binary outputs follow the JSON header, in output order."""
    entries, blobs = [], []
    for name in requested(request, tensors, model_name):
        array = np.ascontiguousarray(tensors[name])
        entry: dict[str, Any] = {
            "name": name, "datatype": datatype_of(array), "shape": list(array.shape),
        }
        if request.wants_binary(name):
            raw = to_binary(array, entry["datatype"])
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif entry["datatype"] == "BYTES":
            entry["data"] = [_as_bytes(v).decode("utf-8", "replace") for v in array.reshape(-1)]
        else:
            entry["data"] = array.reshape(-1)
        entries.append(entry)
    header: dict[str, Any] = {"model_name": model_name, "model_version": version,
                              "outputs": entries}
    if request.id is not None:
        header["id"] = request.id
    json_part = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return json_part, None
    return json_part + b"".join(blobs), len(json_part)
