"""ModelInferRequest -> rows, output tensors -> ModelInferResponse: the v2 tensors of
app/api/v2/codec.py in their protobuf form, checked by the same rules and words.

An input's data comes either raw (``raw_input_contents``, little-endian, BYTES elements each
after its 4-byte length) or typed (``contents``, in the field of its datatype); answers are
always raw, as Triton answers, which every client reads.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.api.v2.checks import check_input, check_outputs, check_served
from app.api.v2.codec import (
    InferRequest,
    from_binary,
    numbers,
    requested,
    rows_of,
    to_binary,
)
from app.errors import InvalidInput
from app.grpc.inference_pb2 import InferParameter, ModelInferRequest, ModelInferResponse
from app.models.signature import TensorSpec, datatype_of
from app.payload import whole_number_of

# The typed ``contents`` field of each datatype (FP16 and BF16 have none: raw only).
TYPED_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def parameter_value(parameter: InferParameter) -> Any:
    """The value a parameter holds, whichever of its kinds it is (None: none set)."""
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def parse_infer(request: ModelInferRequest, max_rows: int, expected: TensorSpec,
                outputs: list[TensorSpec] | None = None) -> InferRequest:
    """The request's rows, outputs and parameters for a model whose one input is ``expected``;
    InvalidInput (or PayloadTooLarge) names any mistake."""
    model = request.model_name
    if len(request.inputs) != 1:
        raise InvalidInput(
            f"expected 1 input tensor in 'inputs' for model '{model}' ({expected.name})")
    tensor = request.inputs[0]
    shape, datatype = list(tensor.shape), tensor.datatype
    check_input(tensor.name, shape, datatype, max_rows, model, expected)
    check_served(tensor.parameters, f"input '{tensor.name}'")
    raw = request.raw_input_contents
    if raw:
        if len(raw) != 1:
            raise InvalidInput(f"expected 1 entry in raw_input_contents, one per input; got "
                               f"{len(raw)}")
        if tensor.HasField("contents"):
            raise InvalidInput(f"input '{tensor.name}': data in both contents and "
                               "raw_input_contents")
        array = from_binary(raw[0], datatype, shape, tensor.name)
    else:
        array = _typed(tensor.contents, datatype, shape, tensor.name)
    names = [out.name for out in request.outputs] or None
    check_outputs(names or [], model, outputs)
    for out in request.outputs:
        check_served(out.parameters, f"output '{out.name}'")
    params = request.parameters
    priority = whole_number_of(parameter_value(params["priority"]) if "priority" in params
                               else None, "parameter 'priority'")
    timeout_us = whole_number_of(parameter_value(params["timeout"]) if "timeout" in params
                                 else None, "parameter 'timeout'")
    return InferRequest(request.id or None, rows_of(array, tensor.name, datatype), names, {},
                        False, priority, timeout_us)


def _typed(contents: Any, datatype: str, shape: list[int], name: str) -> np.ndarray:
    field = TYPED_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"input '{name}': {datatype} data must come in raw_input_contents")
    values = getattr(contents, field)
    count = math.prod(shape)  # Python ints: a huge shape cannot wrap around
    if len(values) != count:
        elsewhere = [f.name for f, _ in contents.ListFields() if f.name != field]
        if elsewhere:  # a client that typed the data as another datatype's
            raise InvalidInput(f"input '{name}': {datatype} data comes in {field}, not in "
                               f"{', '.join(elsewhere)}")
        raise InvalidInput(f"input '{name}': {len(values)} values in {field} do not fill shape "
                           f"{shape}")
    if datatype == "BYTES":
        return np.asarray(list(values), dtype=object).reshape(shape)
    return numbers(values, datatype, name).reshape(shape)


def encode_infer(model_name: str, version: str, request: InferRequest,
                 tensors: dict[str, np.ndarray]) -> ModelInferResponse:
    """The answer: each output named, typed and shaped, its data in raw_output_contents."""
    response = ModelInferResponse(model_name=model_name, model_version=version,
                                  id=request.id or "")
    for name in requested(request, tensors, model_name):
        array = np.ascontiguousarray(tensors[name])
        datatype = datatype_of(array)
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        response.raw_output_contents.append(to_binary(array, datatype))
    return response
