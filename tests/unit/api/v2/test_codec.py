"""The v2 codec's response side: JSON or binary per output, string outputs."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import orjson
import pytest

from app.api.v2.codec import InferRequest, encode_response, from_binary, parse_request
from app.errors import InvalidInput
from app.models.signature import TensorSpec, output_tensors


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


INPUT = TensorSpec("INPUT0", "FP32", (2,))


def infer(inputs: dict, binary: bytes | None = None) -> InferRequest:
    head = json.dumps({"inputs": [inputs]}).encode()  # orjson stops at 64-bit integers
    if binary is None:
        return parse_request(head, None, 16, "m", INPUT)
    return parse_request(head + binary, str(len(head)), 16, "m", INPUT)


@pytest.mark.parametrize(("size", "shows"), [
    (2**63, "9223372036854775808"), (-1, "-1"), (1.5, "1.5"), ("2", '"2"'), (True, "true"),
    (10**30, "1e+30"),  # past 64 bits the JSON parser reads a number as a float
])
def test_a_bad_size_in_shape_is_400_naming_it(size: object, shows: str) -> None:
    with pytest.raises(InvalidInput, match=r"'shape' must be a non-empty list of sizes .*; "
                                           + re.escape(shows) + " is not one"):
        infer({"name": "INPUT0", "shape": [size, 2], "datatype": "FP32", "data": [1, 2]})
    with pytest.raises(InvalidInput, match=re.escape(shows) + " is not one"):
        infer({"name": "INPUT0", "shape": [1, size], "datatype": "FP32", "data": [1, 2]})


@pytest.mark.parametrize("length", ["9" * 5000, "99999999999999999999", "-1", "1.0", "٣", "",
                                    "9999"])
def test_a_header_length_that_is_none_of_the_bodys_is_400(length: str) -> None:
    """Past 4,300 digits int() raises a ValueError of its own (it was a 500)."""
    with pytest.raises(InvalidInput, match="Inference-Header-Content-Length is not a valid"):
        parse_request(b'{"inputs": []}', length, 16, "m", INPUT)


def test_binary_data_must_be_exactly_what_binary_data_size_says() -> None:
    data = np.ones(2, np.float32).tobytes()
    tensor = {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
              "parameters": {"binary_data_size": 8}}
    assert [r.tolist() for r in infer(tensor, data).rows] == [[1.0, 1.0]]
    with pytest.raises(InvalidInput, match="binary_data_size is 8 but the body holds 12 bytes"):
        infer(tensor, data + b"\0\0\0\0")
    with pytest.raises(InvalidInput, match="binary_data_size is 8 but the body holds 4 bytes"):
        infer(tensor, data[:4])
    json_tensor = {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
    with pytest.raises(InvalidInput, match="4 bytes of binary data, but the input has no"):
        infer(json_tensor, b"\0\0\0\0")


@pytest.mark.parametrize(("datatype", "data", "message"), [
    ("INT64", [1, 1.5], "data is not a list of INT64 numbers"),  # numpy would cut it to 1
    ("INT64", [1.0, 2.0], "data is not a list of INT64 numbers"),  # as Triton: whole numbers
    ("INT32", [True, False], "data is not a list of INT32 numbers"),
    ("INT32", ["1", "2"], "data is not a list of INT32 numbers"),
    ("BOOL", [1, 0], "data is not a list of BOOL values"),  # numpy would read 2 as true
    ("INT8", [1, 300], "a number is out of INT8's range"),  # numpy would wrap it around
    ("UINT64", [-1, 2**64 - 1], "a number is out of UINT64's range"),
    ("UINT64", [1.5, 2**64 - 1], "data is not a list of UINT64 numbers"),
])
def test_json_data_of_an_exact_type_must_be_of_its_kind(datatype: str, data: list,
                                                         message: str) -> None:
    spec = TensorSpec("INPUT0", datatype, (2,))
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": datatype,
                                   "data": data}]}).encode()
    with pytest.raises(InvalidInput, match=f"^input 'INPUT0': {message}$"):
        parse_request(body, None, 16, "m", spec)


@pytest.mark.parametrize(("datatype", "data"), [
    ("INT64", [[-(2**63), 2**63 - 1]]), ("UINT64", [1, 2**64 - 1]), ("UINT64", [[1], [2**64 - 1]]),
    ("BOOL", [True, False]), ("INT8", [-128, 127]), ("FP32", [1, 2.5]),
])
def test_json_data_of_its_kind_is_read_exactly(datatype: str, data: list) -> None:
    """Integers past int64 beside small ones, which numpy reads as floats, are still read whole."""
    spec = TensorSpec("INPUT0", datatype, (2,))
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": datatype,
                                   "data": data}]}).encode()
    (row,) = parse_request(body, None, 16, "m", spec).rows
    assert row.tolist() == np.ravel(np.asarray(data, dtype=object)).tolist()


def test_a_binary_nan_is_named_by_its_row_in_the_protocols_words() -> None:
    data = np.array([[1, 2], [3, np.nan]], np.float32).tobytes()
    tensor = {"name": "INPUT0", "shape": [2, 2], "datatype": "FP32",
              "parameters": {"binary_data_size": len(data)}}
    with pytest.raises(InvalidInput, match="^input 'INPUT0': row 1 holds a NaN or an infinity$"):
        infer(tensor, data)


@pytest.mark.parametrize(("timeout", "shows"), [
    (1e30, "1e+30"), (0.5, "0.5"), ("5", '"5"'), (True, "true"), (-1, "-1"), (2**63, str(2**63)),
])
def test_a_bad_timeout_is_named_as_json_writes_it(timeout: object, shows: str) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                                   "data": [1, 2]}], "parameters": {"timeout": timeout}})
    with pytest.raises(InvalidInput, match=re.escape(
            f"parameter 'timeout' must be a whole number >= 0 (at most 2^63 - 1), got {shows}")):
        parse_request(body.encode(), None, 16, "m", INPUT)


@pytest.mark.parametrize(("where", "key", "names"), [
    ("input", "shared_memory_region", "Triton's shared-memory extensions"),
    ("input", "shared_memory_byte_size", "Triton's shared-memory extensions"),
    ("output", "shared_memory_offset", "Triton's shared-memory extensions"),
    ("output", "classification", "the classification extension"),
])
def test_a_parameter_of_an_extension_not_served_is_refused(where: str, key: str,
                                                           names: str) -> None:
    """Read from the request, or answered in full, the tensor would be silently other than its
    client expects: its data in a shared-memory region, or a top-N list."""
    tensor = {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
    payload: dict = {"inputs": [tensor]}
    if where == "input":
        tensor["parameters"] = {key: 1}
    else:
        payload["outputs"] = [{"name": "OUTPUT0", "parameters": {key: 1}}]
    with pytest.raises(InvalidInput, match=f"^{where} '.*0': parameter '{key}' belongs to "
                                           f"{names}.*which this server does not serve"):
        parse_request(json.dumps(payload).encode(), None, 16, "m", INPUT)


@pytest.mark.parametrize("where", ["input", "output"])
def test_a_tensors_parameters_that_are_not_an_object_are_refused(where: str) -> None:
    """As the request's own: a list or a string is a 400, not ignored."""
    tensor: dict = {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
    payload: dict = {"inputs": [tensor]}
    if where == "input":
        tensor["parameters"] = [1]
    else:
        payload["outputs"] = [{"name": "OUTPUT0", "parameters": "binary"}]
    with pytest.raises(InvalidInput, match=f"^{where} '.*0': 'parameters' must be an object$"):
        parse_request(json.dumps(payload).encode(), None, 16, "m", INPUT)


def test_an_empty_outputs_list_asks_for_all_of_them() -> None:
    """``"outputs": []`` names none: every output is answered, as Triton does and as gRPC must
    (an empty repeated field is an absent one), not an answer without outputs."""
    tensor = {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
    request = parse_request(json.dumps({"inputs": [tensor], "outputs": []}).encode(), None,
                            16, "m", INPUT)
    assert request.outputs is None
    body, _ = encode_response("m", "1", request, {"OUTPUT0": np.ones((1, 2), np.float32)})
    assert [o["name"] for o in orjson.loads(body)["outputs"]] == ["OUTPUT0"]


def test_an_output_asked_for_twice_is_refused() -> None:
    payload = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                           "data": [1, 2]}], "outputs": [{"name": "OUTPUT0"}] * 2}
    for known in (None, [TensorSpec("OUTPUT0", "FP32", (2,))]):
        with pytest.raises(InvalidInput, match="^output 'OUTPUT0' is asked for twice$"):
            parse_request(json.dumps(payload).encode(), None, 16, "m", INPUT, known)


@pytest.mark.parametrize(("request_id", "shows"), [
    (5, "5"), (["a"], '["a"]'), (True, "true"),
    ([0] * 1000, "[" + "0, " * 26 + "0... (3000 characters)"),
])
def test_an_id_that_is_not_a_string_is_refused(request_id: object, shows: str) -> None:
    head = json.dumps({"id": request_id, "inputs": [
        {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    with pytest.raises(InvalidInput, match=re.escape(f"'id' must be a string, got {shows}")):
        parse_request(head, None, 16, "m", INPUT)
    assert parse_request(head.replace(json.dumps(request_id).encode(), b'"r1"', 1), None, 16,
                         "m", INPUT).id == "r1"


def _elements(*texts: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(t)) + t for t in texts)


@pytest.mark.parametrize(("raw", "message"), [
    (_elements(b"a"), "1 elements do not fill shape [2]"),
    (_elements(b"a", b"b", b"c"), "more than 2 elements for shape [2]"),
    (_elements(b"a", b"bc")[:-1], "truncated BYTES element"),
    (_elements(b"a") + b"\0\0", "truncated BYTES element"),
], ids=["too-few", "too-many", "cut-string", "cut-length"])
def test_binary_strings_must_be_exactly_the_shapes(raw: bytes, message: str) -> None:
    assert from_binary(_elements(b"a", b"bc"), "BYTES", [2], "t").tolist() == [b"a", b"bc"]
    with pytest.raises(InvalidInput, match=re.escape(message)):
        from_binary(raw, "BYTES", [2], "t")


def test_binary_strings_past_the_shape_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of a million empty strings for a shape of one costs a few reads, not a million
    (4 s of a front end's event loop for 16 MB)."""
    reads = []
    unpack = struct.unpack_from
    monkeypatch.setattr(struct, "unpack_from", lambda *a: reads.append(1) or unpack(*a))
    with pytest.raises(InvalidInput, match=re.escape("more than 1 elements for shape [1]")):
        from_binary(_elements(b"") * 1_000_000, "BYTES", [1], "t")
    assert len(reads) == 1


def test_json_rows_are_dense_rows_a_tensor_models_decode_takes_as_they_are() -> None:
    """Cast from JSON's numbers and checked finite, as /predict's dense rows are; binary rows,
    read-only views of the body, are checked by the decode as before."""
    from app.models.tensor import TensorHandler
    from app.payload import DenseRows

    handler = TensorHandler("m", lambda d: None, (2,))  # type: ignore[arg-type,return-value]
    rows = infer({"name": "INPUT0", "shape": [2, 2], "datatype": "FP32",
                  "data": [[1, 2], [3, 4.5]]}).rows
    assert type(rows) is DenseRows and rows[0].dtype == np.float32
    assert handler.decode(rows) is rows
    data = np.ones((1, 2), np.float32).tobytes()
    binary = infer({"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                    "parameters": {"binary_data_size": 8}}, data).rows
    assert type(binary) is list and not binary[0].flags.writeable


@pytest.mark.parametrize(("raw", "header"), [
    (b'{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": ["1", "2"],'
     b' "name": "INPUT0"}]}', False),  # a key twice: orjson's parse, not the dense one
    (b'{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, true]}]}',
     True),  # a JSON header of the whole body, as the binary extension sends one
    (b'{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",'
     b' "data": [[1], [null]]}]}', True),
    (b'{"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": 5}]}', False),
])
def test_float_data_left_to_orjson_must_be_numbers_too(raw: bytes, header: bool) -> None:
    """What the dense parse does not take is held to its rule: a list of numbers."""
    spec = TensorSpec("INPUT0", "FP32", None)
    with pytest.raises(InvalidInput, match="^input 'INPUT0': data is not a list of FP32 numbers$"):
        parse_request(raw, str(len(raw)) if header else None, 16, "m", spec)
