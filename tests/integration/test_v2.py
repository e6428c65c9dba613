"""The Open Inference Protocol v2 routes, driven by the stock ``tritonclient[http]`` client."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from app.models.builtin import linear_module
from tests.conftest import live_server, make_settings

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
    x = np.ones((2, 4), dtype=np.float64)  # FP64 in: converted like JSON numbers
    inp = triton.InferInput("INPUT0", [2, 4], "FP64")
    inp.set_data_from_numpy(x)
    got = client_for(server.url).infer("linear", [inp]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, expected(x.astype(np.float32)), rtol=1e-6)


def test_health_and_metadata(server) -> None:  # type: ignore[no-untyped-def]
    client = client_for(server.url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("linear")
    meta = client.get_model_metadata("linear")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 2]}]
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]


def test_errors_use_the_protocol_form(server) -> None:  # type: ignore[no-untyped-def]
    client = client_for(server.url)
    inp = triton.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException, match=r"expected shape \[4\], got \[3\]"):
        client.infer("linear", [inp])
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("nope")
    r = httpx.post(server.url + "/v2/models/linear/infer", content=b"{")
    assert r.status_code == 422 and isinstance(r.json()["error"], str)
    r = httpx.post(server.url + "/v2/models/linear/infer",
                   json={"inputs": [{"name": "INPUT0", "shape": [9, 4], "datatype": "FP32",
                                     "data": [0.0] * 36}]})
    assert r.status_code == 413 and "limit of 8" in r.json()["error"]
    r = httpx.post(server.url + "/v2/models/nope/infer", json={})
    assert r.status_code == 404 and "unknown model" in r.json()["error"]
    r = httpx.post(server.url + "/v2/models/linear/infer",
                   json={"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                     "data": [1, 2, 3, 4]}], "outputs": [{"name": "X"}]})
    assert r.status_code == 422 and "unknown output" in r.json()["error"]


def test_rows_join_the_same_batcher(server) -> None:  # type: ignore[no-untyped-def]
    before = server.app.state.metrics.batch_size._sum.get()
    x = np.zeros((5, 4), dtype=np.float32)
    inp = triton.InferInput("INPUT0", [5, 4], "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    client_for(server.url).infer("linear", [inp])
    assert server.app.state.metrics.batch_size._sum.get() - before == 5


@pytest.mark.parametrize("binary", [True, False])
def test_text_model_with_bytes(binary: bool) -> None:
    from app.models.minilm import MiniLMHandler

    handler = MiniLMHandler()
    with live_server(make_settings(model="minilm"), handler) as srv:
        texts = np.array([b"Hello, world.", "Übung".encode()], dtype=object)
        inp = triton.InferInput("INPUT0", [2], "BYTES")
        inp.set_data_from_numpy(texts, binary_data=binary)
        got = client_for(srv.url).infer("minilm", [inp]).as_numpy("OUTPUT0")
        r = httpx.post(srv.url + "/predict", json={"instances": ["Hello, world.", "Übung"]})
    assert got.shape == (2, 384)
    np.testing.assert_allclose(got, np.array(r.json()["predictions"], dtype=np.float32), atol=1e-6)
