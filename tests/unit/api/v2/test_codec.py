"""The v2 codec's response side: JSON or binary per output, string outputs."""

from __future__ import annotations

import struct

import numpy as np
import orjson

from app.api.v2.codec import InferRequest, encode_response, output_tensors


def request(binary: dict[str, bool], binary_all: bool) -> InferRequest:
    return InferRequest(id="r", rows=[], outputs=None, binary=binary, binary_all=binary_all)


def test_an_outputs_own_choice_wins() -> None:
    tensors = output_tensors([(np.ones(2, np.float32), np.array("x")),
                              (np.zeros(2, np.float32), np.array("yz"))])
    body, length = encode_response("m", "1", request({"OUTPUT0": False}, True), tensors)
    assert length is not None
    header = orjson.loads(body[:length])
    first, second = header["outputs"]
    assert first["data"] == [1.0, 1.0, 0.0, 0.0] and "parameters" not in first
    assert second["datatype"] == "BYTES" and second["shape"] == [2]
    assert body[length:] == struct.pack("<I", 1) + b"x" + struct.pack("<I", 2) + b"yz"
    assert second["parameters"]["binary_data_size"] == len(body) - length


def test_string_outputs_in_json() -> None:
    body, length = encode_response("m", "1", request({}, False),
                                   output_tensors([np.array("é"), np.array("b")]))
    assert length is None
    assert orjson.loads(body)["outputs"][0] == {"name": "OUTPUT0", "datatype": "BYTES",
                                                "shape": [2], "data": ["é", "b"]}
