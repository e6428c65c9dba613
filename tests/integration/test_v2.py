"""The Open Inference Protocol v2 routes, driven by the stock ``tritonclient[http]`` client."""

from __future__ import annotations

import httpx
import numpy as np
import orjson
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from app.models.builtin import linear_module
from tests.conftest import live_server, make_settings, sample
from tests.fakes import IdsHandler

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    with live_server(make_settings(max_instances=8)) as srv:
        yield srv


def client_for(url: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url.removeprefix("http://"))


def expected(x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return linear_module()(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_infer_matches_the_model(server, binary_in: bool, binary_out: bool) -> None:  # type: ignore[no-untyped-def]
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    inp = triton.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary_in)
    out = triton.InferRequestedOutput("OUTPUT0", binary_data=binary_out)
    result = client_for(server.url).infer("linear", [inp], outputs=[out], request_id="r-1")
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (3, 2) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected(x), rtol=1e-6, atol=1e-6)
    assert result.get_response()["id"] == "r-1"


def test_no_outputs_named_means_all_in_binary(server) -> None:  # type: ignore[no-untyped-def]
    x = np.ones((2, 4), dtype=np.float32)
    inp = triton.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    got = client_for(server.url).infer("linear", [inp]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, expected(x), rtol=1e-6)


def test_health_and_metadata(server) -> None:  # type: ignore[no-untyped-def]
    client = client_for(server.url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("linear") and client.is_model_ready("linear", "1")
    meta = client.get_model_metadata("linear")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 2]}]
    assert {"binary_tensor_data", "model_configuration"} <= set(
        client.get_server_metadata()["extensions"]
    )


def test_config_is_tritons(server) -> None:  # type: ignore[no-untyped-def]
    config = client_for(server.url).get_model_config("linear")
    assert config["name"] == "linear" and config["max_batch_size"] == 32
    assert config["input"][0] | {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]} \
        == config["input"][0]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] \
        == [("OUTPUT0", "TYPE_FP32", [2])]
    batching = config["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 5000
    assert (batching["priority_levels"], batching["default_priority_level"]) == (2, 2)
    assert batching["default_queue_policy"] == {
        "timeout_action": "REJECT", "default_timeout_microseconds": 30_000_000,
        "allow_timeout_override": True, "max_queue_size": 64}
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert httpx.get(server.url + "/v2/models/linear/versions/1/config").json() == config
    r = httpx.get(server.url + "/v2/models/linear/versions/7/config")
    assert r.status_code == 404 and "no version '7'" in r.json()["error"]


def test_undeclared_outputs_are_learned_at_warm_up() -> None:
    """A module that declares no output shape: the warm-up's results give the real one."""
    with live_server(make_settings(model="tests.fakes:pair_module")) as srv:
        meta = client_for(srv.url).get_model_metadata("pair_module")
        config = client_for(srv.url).get_model_config("pair_module")
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 2, 3]}]
    assert config["output"][0]["dims"] == [2, 3]


def infer_json(url: str, body: object, model: str = "linear") -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", json=body)


def one_input(**fields: object) -> dict[str, object]:
    tensor = {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
    return {"inputs": [tensor | fields]}


@pytest.mark.parametrize(
    ("body", "contains"),
    [
        (one_input(name="X"), "unexpected inference input 'X' for model 'linear'"),
        (one_input(datatype="FP64"), "data-type is 'FP64', but model 'linear' expects 'FP32'"),
        (one_input(shape=[1, 3], data=[1, 2, 3]), "expected shape [4], got [3]"),
        (one_input(shape=[1, 4294967296, 4294967296]), "got [4294967296, 4294967296] per row"),
        (one_input(shape=[2, 4]), "4 values do not fill shape [2, 4]"),
        (one_input(data=["a", "b", "c", "d"]), "not a list of FP32 numbers"),
        ({"inputs": []}, "expected 1 input tensor"),
        ({**one_input(), "outputs": [{"name": "X"}]}, "unexpected inference output 'X'"),
        ({**one_input(), "parameters": {"priority": 3}}, "priority 3 is out of range"),
        ({**one_input(), "parameters": {"priority": "high"}}, "'priority' must be a whole"),
        ({**one_input(), "parameters": "fast"}, "'parameters' must be an object"),
        ({**one_input(), "parameters": {"timeout": -1}}, "'timeout' must be a whole number"),
        ({**one_input(), "parameters": {"timeout": 0.5}}, "'timeout' must be a whole number"),
        ({**one_input(), "parameters": {"binary_data_output": 1}},
         "the request: parameter 'binary_data_output' must be true or false, got 1"),
        ({**one_input(), "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}]},
         "output 'OUTPUT0': parameter 'binary_data' must be true or false, got \"yes\""),
    ],
)
def test_client_mistakes_get_400(server, body: object, contains: str) -> None:  # type: ignore[no-untyped-def]
    def counted(status: str) -> float:
        return sample(httpx.get(server.url + "/metrics").text, "batchserve_requests_total",
                      model="linear", status=status)

    before = counted("400"), counted("422")
    r = infer_json(server.url, body)
    assert r.status_code == 400, r.text
    assert contains in r.json()["error"]
    assert (counted("400"), counted("422")) == (before[0] + 1, before[1])  # as answered


def test_overflowing_binary_shape_is_400(server) -> None:  # type: ignore[no-untyped-def]
    header = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4294967296, 4294967296],
                                       "datatype": "FP32",
                                       "parameters": {"binary_data_size": 16}}]})
    r = httpx.post(server.url + "/v2/models/linear/infer", content=header + bytes(16),
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400 and "expected shape [4]" in r.json()["error"]


def test_an_outputs_own_choice_wins_over_the_requests(server) -> None:  # type: ignore[no-untyped-def]
    body = {**one_input(), "parameters": {"binary_data_output": True},
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}
    r = infer_json(server.url, body)
    assert r.status_code == 200 and "inference-header-content-length" not in r.headers
    assert r.json()["outputs"][0]["data"] == pytest.approx(expected(
        np.array([[1, 2, 3, 4]], dtype=np.float32)).reshape(-1).tolist(), rel=1e-6)


def test_tritonclients_priority_is_the_requests_level(server) -> None:  # type: ignore[no-untyped-def]
    x = np.ones((1, 4), dtype=np.float32)
    inp = triton.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    for priority in (1, 2, 0):
        got = client_for(server.url).infer("linear", [inp], priority=priority)
        np.testing.assert_allclose(got.as_numpy("OUTPUT0"), expected(x), rtol=1e-6)
    with pytest.raises(InferenceServerException, match="priority 7 is out of range"):
        client_for(server.url).infer("linear", [inp], priority=7)


def test_tritonclients_timeout_is_the_requests_deadline(server) -> None:  # type: ignore[no-untyped-def]
    """tritonclient's ``timeout`` (microseconds) shortens the deadline as X-Request-Timeout
    does: one microsecond cannot be met (refused at arrival, or timed out), a minute can, and 0
    means the model's own timeout."""
    x = np.ones((1, 4), dtype=np.float32)
    inp = triton.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    client = client_for(server.url)
    for timeout in (60_000_000, 0):
        got = client.infer("linear", [inp], timeout=timeout)
        np.testing.assert_allclose(got.as_numpy("OUTPUT0"), expected(x), rtol=1e-6)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("linear", [inp], timeout=1)
    assert refused.value.status() in ("503", "504"), refused.value


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_tritonclients_compressed_requests_are_inflated(server, compression: str) -> None:  # type: ignore[no-untyped-def]
    """tritonclient's ``request_compression_algorithm`` sends the body compressed, as Triton
    takes it; its ``response_compression_algorithm`` only asks, and a plain answer serves."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for binary in (True, False):
        inp = triton.InferInput("INPUT0", [2, 4], "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        got = client_for(server.url).infer("linear", [inp],
                                           request_compression_algorithm=compression,
                                           response_compression_algorithm=compression)
        np.testing.assert_allclose(got.as_numpy("OUTPUT0"), expected(x), rtol=1e-6)
    r = httpx.post(server.url + "/v2/models/linear/infer", content=b"{}",
                   headers={"content-encoding": "br"})
    assert r.status_code == 415 and "gzip, deflate or none" in r.json()["error"]


def test_errors_use_the_protocol_form(server) -> None:  # type: ignore[no-untyped-def]
    client = client_for(server.url)
    inp = triton.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException, match=r"expected shape \[4\], got \[3\]"):
        client.infer("linear", [inp])
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("nope")
    r = httpx.post(server.url + "/v2/models/linear/infer", content=b"{")
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    r = httpx.post(server.url + "/v2/models/linear/infer",
                   json={"inputs": [{"name": "INPUT0", "shape": [9, 4], "datatype": "FP32",
                                     "data": [0.0] * 36}]})
    assert r.status_code == 413 and "limit of 8" in r.json()["error"]
    r = httpx.post(server.url + "/v2/models/nope/infer", json={})
    assert r.status_code == 404 and "unknown model" in r.json()["error"]
    # An extension this server does not serve: a 404 the client can read, not its own TypeError.
    with pytest.raises(InferenceServerException) as refused:
        client.get_trace_settings(model_name="linear")
    assert refused.value.status() == "404" and str(refused.value) == "[404] Not Found"


def test_rows_join_the_same_batcher(server) -> None:  # type: ignore[no-untyped-def]
    registry = server.app.state.service.metrics.registry
    before = sample(registry, "batchserve_batch_size_sum")
    x = np.zeros((5, 4), dtype=np.float32)
    inp = triton.InferInput("INPUT0", [5, 4], "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    client_for(server.url).infer("linear", [inp])
    assert sample(registry, "batchserve_batch_size_sum") - before == 5


@pytest.mark.parametrize("binary", [True, False])
def test_text_model_with_bytes(binary: bool) -> None:
    from app.models.minilm import MiniLMHandler

    handler = MiniLMHandler()
    with live_server(make_settings(model="minilm"), handler) as srv:
        config = client_for(srv.url).get_model_config("minilm")
        assert config["input"][0]["data_type"] == "TYPE_STRING"
        assert config["output"][0]["dims"] == [384]
        texts = np.array([b"Hello, world.", "Übung".encode()], dtype=object)
        inp = triton.InferInput("INPUT0", [2], "BYTES")
        inp.set_data_from_numpy(texts, binary_data=binary)
        got = client_for(srv.url).infer("minilm", [inp]).as_numpy("OUTPUT0")
        r = httpx.post(srv.url + "/predict", json={"instances": ["Hello, world.", "Übung"]})
    assert got.shape == (2, 384)
    np.testing.assert_allclose(got, np.array(r.json()["predictions"], dtype=np.float32), atol=1e-6)


def test_an_int64_model_takes_whole_numbers_as_json_or_binary() -> None:
    """A handler's INT64 input (token ids): its config says TYPE_INT64, JSON and binary data
    are read exactly (a value past 2^53, which a float would round), and JSON's 1.5 is
    refused, not cut to 1."""
    with live_server(make_settings(model="tests.fakes:IdsHandler"), IdsHandler()) as srv:
        client = client_for(srv.url)
        assert client.get_model_config("ids")["input"][0]["data_type"] == "TYPE_INT64"
        x = np.array([[1, 2, 3, 4], [2**60 + 1, 0, 0, 1]], dtype=np.int64)
        for binary in (True, False):
            inp = triton.InferInput("INPUT0", [2, 4], "INT64")
            inp.set_data_from_numpy(x, binary_data=binary)
            got = client.infer("ids", [inp]).as_numpy("OUTPUT0")
            assert got.dtype == np.int64 and got.tolist() == [10, 2**60 + 2]
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "INT64",
                            "data": [1, 2, 3, 4.5]}]}
        r = httpx.post(srv.url + "/v2/models/ids/infer", json=body)
        assert r.status_code == 400
        assert r.json() == {"error": "input 'INPUT0': data is not a list of INT64 numbers"}
