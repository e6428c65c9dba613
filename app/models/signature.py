"""A model's tensors as the Open Inference Protocol names them: name, datatype, per-item shape.

Outputs a handler does not declare are learned from its warm-up results (``describe_outputs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.arrays import Results

INPUT_NAME = "INPUT0"
OUTPUT_NAME = "OUTPUT0"

DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}

Shape = tuple[int, ...]  # per item, without the batch dimension; -1 where it varies


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # a key of DATATYPES, or BYTES
    shape: Shape | None  # None: not known


def datatype_of(array: np.ndarray) -> str:
    """The v2 datatype of a numpy array (ValueError for dtypes the protocol has no name for)."""
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    if dtype.kind in "OSU":
        return "BYTES"
    name = _NAMES.get(dtype)
    if name is None:
        raise ValueError(f"no v2 datatype for numpy {array.dtype}")
    return name


def output_columns(result: Any) -> dict[str, Any]:
    """One item's result by output name: a dict's keys, a tuple's or list's positions
    (OUTPUT0, OUTPUT1, ...), or the one output OUTPUT0."""
    if isinstance(result, dict):
        return {str(k): v for k, v in result.items()}
    if isinstance(result, (tuple, list)):
        return {f"OUTPUT{i}": v for i, v in enumerate(result)}
    return {OUTPUT_NAME: result}


def output_tensors(results: Results) -> dict[str, np.ndarray]:
    """Stack per-item results into named output tensors (app.models.signature names them).
    Results that came as one block (a request's rows computed together) are the one output."""
    if type(results) is np.ndarray:
        return {OUTPUT_NAME: results}
    columns = [output_columns(r) for r in results]
    return {name: np.stack([np.asarray(c[name]) for c in columns]) for name in columns[0]}


def describe_outputs(results: list[Any]) -> list[TensorSpec]:
    """Output specs from per-item results (the warm-up's): a dimension that differs between
    items is -1."""
    specs: dict[str, TensorSpec] = {}
    for result in results:
        for name, value in output_columns(result).items():
            array = np.asarray(value)
            spec = TensorSpec(name, datatype_of(array), tuple(array.shape))
            seen = specs.get(name)
            if seen is not None and seen.shape is not None and spec.shape is not None:
                spec = TensorSpec(name, spec.datatype, _merge(seen.shape, spec.shape))
            specs[name] = spec
    return list(specs.values())


def _merge(a: Shape, b: Shape) -> Shape:
    if len(a) != len(b):
        return (-1,) * max(len(a), len(b))  # ranks differ: nothing is known but a rank
    return tuple(x if x == y else -1 for x, y in zip(a, b, strict=True))
