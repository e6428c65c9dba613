"""Open Inference Protocol v2 (KServe v2 / Triton HTTP) tensors, JSON and binary extension.

Pure functions: bytes in, numpy out and back. A request carries one input tensor whose first
dimension is the batch; each row becomes one item for the same batcher as /predict.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from app.errors import InvalidInput, PayloadTooLarge

HEADER_LENGTH = "inference-header-content-length"

DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}


@dataclass
class InferRequest:
    id: str | None
    input_name: str
    rows: list[Any]  # one per batch row: a numpy array, or a str for BYTES
    outputs: list[str] | None  # names asked for (None: all)
    binary: set[str] = field(default_factory=set)  # outputs to send as binary data
    binary_all: bool = False


def parse_request(body: bytes, header_length: str | None, max_rows: int) -> InferRequest:
    """Parse an infer request (JSON, or JSON header + binary tensors). Raises InvalidInput."""
    json_part, binary = body, b""
    if header_length is not None:
        digits = header_length.isascii() and header_length.isdigit()  # not "²" or "٣"
        json_size = int(header_length) if digits else -1
        if not 0 <= json_size <= len(body):
            raise InvalidInput("Inference-Header-Content-Length is not a valid length")
        json_part, binary = body[:json_size], body[json_size:]
    try:
        payload = orjson.loads(json_part)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidInput("request must be a JSON object")
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InvalidInput("request must have exactly one input tensor in 'inputs'")
    tensor = inputs[0]
    name, shape, datatype = tensor.get("name"), tensor.get("shape"), tensor.get("datatype")
    if not isinstance(name, str):
        raise InvalidInput("input needs a string 'name'")
    if (not isinstance(shape, list) or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise InvalidInput(f"input '{name}': 'shape' must be a non-empty list of sizes")
    if shape[0] == 0:
        raise InvalidInput(f"input '{name}': the batch dimension is 0; send at least one row")
    if shape[0] > max_rows:
        raise PayloadTooLarge(f"{shape[0]} rows is more than the limit of {max_rows} per request")
    if datatype != "BYTES" and datatype not in DATATYPES:
        raise InvalidInput(f"input '{name}': unsupported datatype {datatype!r}")
    params = tensor.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is not None:
        if not isinstance(size, int) or size < 0 or size > len(binary):
            raise InvalidInput(f"input '{name}': binary_data_size does not match the body")
        array = _from_binary(binary[:size], datatype, shape, name)
    elif "data" in tensor:
        array = _from_json(tensor["data"], datatype, shape, name)
    else:
        raise InvalidInput(f"input '{name}': no 'data' and no binary_data_size")
    rows: list[Any]
    if datatype == "BYTES":
        if int(np.prod(shape[1:])) != 1:
            raise InvalidInput(f"input '{name}': BYTES input must have one element per row")
        rows = [_text(v, name, i) for i, v in enumerate(array.reshape(shape[0]))]
    else:
        rows = list(array)
    outputs, binary_out = _requested_outputs(payload)
    request_params = payload.get("parameters") or {}
    binary_all = (
        isinstance(request_params, dict) and request_params.get("binary_data_output") is True
    )
    request_id = payload.get("id")
    return InferRequest(
        request_id if isinstance(request_id, str) else None, name, rows, outputs, binary_out,
        binary_all,
    )


def _requested_outputs(payload: dict[str, Any]) -> tuple[list[str] | None, set[str]]:
    outputs = payload.get("outputs")
    if outputs is None:
        return None, set()
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise InvalidInput("'outputs' must be a list of objects")
    names, binary = [], set()
    for out in outputs:
        name = out.get("name")
        if not isinstance(name, str):
            raise InvalidInput("each requested output needs a string 'name'")
        names.append(name)
        params = out.get("parameters") or {}
        if isinstance(params, dict) and params.get("binary_data") is True:
            binary.add(name)
    return names, binary


def _from_json(data: Any, datatype: str, shape: list[int], name: str) -> np.ndarray:
    count = int(np.prod(shape))
    if datatype == "BYTES":
        flat = np.asarray(data, dtype=object).reshape(-1) if isinstance(data, list) else None
        if flat is None or flat.size != count:
            raise InvalidInput(f"input '{name}': expected {count} strings for shape {shape}")
        return flat.reshape(shape)
    try:
        array = np.asarray(data, dtype=DATATYPES[datatype])
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(f"input '{name}': data is not a list of {datatype} numbers") from None
    if array.size != count:
        raise InvalidInput(f"input '{name}': {array.size} values do not fill shape {shape}")
    return array.reshape(shape)


def _from_binary(raw: bytes, datatype: str, shape: list[int], name: str) -> np.ndarray:
    count = int(np.prod(shape))
    if datatype == "BYTES":
        values, offset = [], 0
        while offset < len(raw):
            if offset + 4 > len(raw):
                raise InvalidInput(f"input '{name}': truncated BYTES element")
            (length,) = struct.unpack_from("<I", raw, offset)
            offset += 4
            if offset + length > len(raw):
                raise InvalidInput(f"input '{name}': truncated BYTES element")
            values.append(raw[offset: offset + length])
            offset += length
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


def output_tensors(results: list[Any], default_name: str) -> dict[str, np.ndarray]:
    """Stack per-item results into named output tensors (dict results give one per key)."""
    if results and isinstance(results[0], dict):
        return {k: np.stack([np.asarray(r[k]) for r in results]) for k in results[0]}
    return {default_name: np.stack([np.asarray(r) for r in results])}


def datatype_of(array: np.ndarray) -> str:
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    name = _NAMES.get(dtype)
    if name is None:
        raise ValueError(f"no v2 datatype for numpy {array.dtype}")
    return name


def encode_response(
    model_name: str, request: InferRequest, tensors: dict[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """(body, header length or None). Binary outputs follow the JSON header, in output order."""
    names = request.outputs if request.outputs is not None else list(tensors)
    unknown = [n for n in names if n not in tensors]
    if unknown:
        raise InvalidInput(f"unknown output {unknown[0]!r}; this model has {sorted(tensors)}")
    entries, blobs = [], []
    for name in names:
        array = np.ascontiguousarray(tensors[name])
        entry: dict[str, Any] = {
            "name": name, "datatype": datatype_of(array), "shape": list(array.shape),
        }
        if request.binary_all or name in request.binary:
            raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = array.reshape(-1)
        entries.append(entry)
    header: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": entries}
    if request.id is not None:
        header["id"] = request.id
    json_part = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return json_part, None
    return json_part + b"".join(blobs), len(json_part)
