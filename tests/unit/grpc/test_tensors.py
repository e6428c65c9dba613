"""app/grpc/tensors.py: ModelInferRequest -> rows by the v2 rules, outputs -> raw contents."""

from __future__ import annotations

import numpy as np
import pytest

from app.api.v2.codec import InferRequest
from app.errors import InvalidInput, PayloadTooLarge
from app.grpc import inference_pb2 as pb
from app.grpc.tensors import TYPED_FIELD, encode_infer, parameter_value, parse_infer
from app.models.signature import DATATYPES, TensorSpec


def request(datatype: str, shape: list[int], **contents: list[object]) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="INPUT0", datatype=datatype, shape=shape,
                 contents=pb.InferTensorContents(**contents) if contents else None)
    return r


@pytest.mark.parametrize("datatype", sorted(TYPED_FIELD.keys() - {"BYTES"}))
def test_typed_and_raw_contents_give_the_same_rows(datatype: str) -> None:
    dtype = DATATYPES[datatype]
    values = np.arange(6).reshape(2, 3).astype(dtype)
    typed = request(datatype, [2, 3], **{TYPED_FIELD[datatype]: values.reshape(-1).tolist()})
    raw = request(datatype, [2, 3])
    raw.raw_input_contents.append(values.astype(dtype.newbyteorder("<")).tobytes())
    spec = TensorSpec("INPUT0", datatype, (3,))
    for r in (typed, raw):
        rows = parse_infer(r, 8, spec).rows
        assert len(rows) == 2 and all(row.dtype == dtype for row in rows)
        np.testing.assert_array_equal(np.stack(rows), values)


def test_bytes_rows_are_text_either_way() -> None:
    spec = TensorSpec("INPUT0", "BYTES", None)
    typed = request("BYTES", [2], bytes_contents=[b"a", "Ü".encode()])
    raw = request("BYTES", [2])
    raw.raw_input_contents.append(b"\x01\x00\x00\x00a\x02\x00\x00\x00" + "Ü".encode())
    assert parse_infer(typed, 8, spec).rows == parse_infer(raw, 8, spec).rows == ["a", "Ü"]
    with pytest.raises(InvalidInput, match="row 0: not valid UTF-8"):
        parse_infer(request("BYTES", [1], bytes_contents=[b"\xff"]), 8, spec)


@pytest.mark.parametrize(("build", "error", "message"), [
    (lambda r: r.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 3],
                            contents=pb.InferTensorContents(int_contents=[1, 300, 2])),
     InvalidInput, "out of INT8's range"),
    (lambda r: (r.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 3]),
                r.raw_input_contents.extend([b"abc", b"def"])), InvalidInput,
     "expected 1 entry in raw_input_contents"),
    (lambda r: (r.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 3],
                             contents=pb.InferTensorContents(int_contents=[1, 2, 3])),
                r.raw_input_contents.append(b"abc")), InvalidInput, "in both contents and raw"),
    (lambda r: r.inputs.add(name="INPUT0", datatype="INT8", shape=[1, -3]), InvalidInput,
     "-3 is not one"),
    (lambda r: r.inputs.add(name="INPUT0", datatype="INT8", shape=[5, 3]), PayloadTooLarge,
     "limit of 4"),
    (lambda r: (r.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 3],
                             contents=pb.InferTensorContents(int_contents=[1, 2, 3])),
                r.parameters["timeout"].CopyFrom(pb.InferParameter(double_param=1.5))),
     InvalidInput, "parameter 'timeout' must be a whole number"),
    (lambda r: r.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 3], parameters={
        "shared_memory_region": pb.InferParameter(string_param="region")}), InvalidInput,
     "^input 'INPUT0': parameter 'shared_memory_region' belongs to Triton's shared-memory"),
    (lambda r: (r.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 3],
                             contents=pb.InferTensorContents(int_contents=[1, 2, 3])),
                r.outputs.add(name="OUTPUT0", parameters={
                    "classification": pb.InferParameter(int64_param=2)})), InvalidInput,
     "^output 'OUTPUT0': parameter 'classification' belongs to the classification extension"),
    (lambda r: (r.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 3],
                             contents=pb.InferTensorContents(int_contents=[1, 2, 3])),
                r.outputs.add(name="OUTPUT0"), r.outputs.add(name="OUTPUT0")), InvalidInput,
     "^output 'OUTPUT0' is asked for twice$"),
])
def test_mistakes_are_named(build: object, error: type[Exception], message: str) -> None:
    r = pb.ModelInferRequest(model_name="m")
    build(r)  # type: ignore[operator]
    with pytest.raises(error, match=message):
        parse_infer(r, 4, TensorSpec("INPUT0", "INT8", (3,)))


def test_half_floats_come_raw() -> None:
    spec = TensorSpec("INPUT0", "FP16", (2,))
    with pytest.raises(InvalidInput, match="FP16 data must come in raw_input_contents"):
        parse_infer(request("FP16", [1, 2], fp32_contents=[1.0, 2.0]), 4, spec)
    raw = request("FP16", [1, 2])
    raw.raw_input_contents.append(np.array([1.0, 2.0], "<f2").tobytes())
    assert parse_infer(raw, 4, spec).rows[0].tolist() == [1.0, 2.0]


def test_parameters_and_outputs() -> None:
    r = request("FP32", [1, 2], fp32_contents=[1.0, 2.0])
    r.parameters["priority"].uint64_param = 2  # as tritonclient sends it
    r.parameters["timeout"].int64_param = 5000
    r.outputs.add(name="OUTPUT0")
    parsed = parse_infer(r, 4, TensorSpec("INPUT0", "FP32", (2,)),
                         [TensorSpec("OUTPUT0", "FP32", (2,))])
    assert (parsed.priority, parsed.timeout_us, parsed.outputs) == (2, 5000, ["OUTPUT0"])
    assert parameter_value(pb.InferParameter()) is None
    with pytest.raises(InvalidInput, match="unexpected inference output 'X'"):
        r.outputs.add(name="X")
        parse_infer(r, 4, TensorSpec("INPUT0", "FP32", (2,)),
                    [TensorSpec("OUTPUT0", "FP32", (2,))])


def test_answers_are_raw_little_endian_and_name_what_was_asked() -> None:
    tensors = {"A": np.array([[1.5, 2.5]], dtype=np.float32),
               "B": np.array([["x"]], dtype=object)}
    answer = encode_infer("m", "3", InferRequest("id-1", [], None, {}), tensors)
    assert (answer.model_name, answer.model_version, answer.id) == ("m", "3", "id-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [
        ("A", "FP32", [1, 2]), ("B", "BYTES", [1, 1])]
    assert answer.raw_output_contents[0] == np.array([1.5, 2.5], "<f4").tobytes()
    assert answer.raw_output_contents[1] == b"\x01\x00\x00\x00x"
    only_b = encode_infer("m", "3", InferRequest(None, [], ["B"], {}), tensors)
    assert [o.name for o in only_b.outputs] == ["B"] and only_b.id == ""
