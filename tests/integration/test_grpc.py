"""The Open Inference Protocol over gRPC, driven by the stock ``tritonclient.grpc`` client and by
the gRPC stub and messages it ships (the typed ``contents`` its client never sends), and the
standard health service as grpc_health_probe and kubelets call it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import re
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceStub
from tritonclient.utils import InferenceServerException

from tests.conftest import (
    WAIT_S,
    LiveServer,
    live_server,
    make_settings,
    queued,
    sample,
    wait_until,
    wait_until_sync,
)
from tests.fakes import GatedHandler, IdsHandler, SlowBuild, export_scale
from tests.grpc_clients import client_for, echo_request, expected, one_input, stub

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(make_settings(max_instances=8), grpc=True) as srv:
        yield srv


@asynccontextmanager
async def gated_calls(**overrides: Any
                      ) -> AsyncIterator[tuple[GatedHandler, LiveServer, GRPCInferenceServiceStub]]:
    """A server (``overrides`` to its settings) on a ``GatedHandler``, and a stub on a channel
    to it."""
    handler = GatedHandler()
    with live_server(make_settings(**overrides), handler, grpc=True) as srv:
        assert srv.grpc_url is not None
        async with grpc.aio.insecure_channel(srv.grpc_url) as channel:
            yield handler, srv, GRPCInferenceServiceStub(channel)


def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failed:
        call()  # type: ignore[operator]
    return failed.value.code()  # type: ignore[attr-defined, no-any-return]


def test_raw_tensors_match_the_model_and_count_as_grpc(server: LiveServer) -> None:
    registry = server.app.state.service.metrics.registry
    before = sample(registry, "batchserve_requests_total", protocol="grpc", status="200")
    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    got = client_for(server).infer("linear", [one_input(x)],
                                   outputs=[triton.InferRequestedOutput("OUTPUT0")])
    np.testing.assert_allclose(got.as_numpy("OUTPUT0"), expected(x), rtol=1e-6)
    assert got.get_response().model_version == "1"
    assert sample(registry, "batchserve_requests_total", protocol="grpc", status="200") \
        - before == 1


def test_typed_contents_match_the_model(server: LiveServer) -> None:
    x = np.random.default_rng(1).random((2, 4), dtype=np.float32)
    request = pb.ModelInferRequest(model_name="linear", id="typed-1")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 4],
                       contents=pb.InferTensorContents(fp32_contents=x.reshape(-1).tolist()))
    answer = stub(server).ModelInfer(request)
    assert answer.id == "typed-1" and answer.outputs[0].name == "OUTPUT0"
    assert list(answer.outputs[0].shape) == [2, 2] and answer.outputs[0].datatype == "FP32"
    got = np.frombuffer(answer.raw_output_contents[0], dtype="<f4").reshape(2, 2)
    np.testing.assert_allclose(got, expected(x), rtol=1e-6)


@pytest.mark.asyncio
async def test_async_infer(server: LiveServer) -> None:
    assert server.grpc_url is not None
    xs = [np.full((1, 4), float(i), dtype=np.float32) for i in range(8)]
    async with triton_aio.InferenceServerClient(server.grpc_url) as client:
        answers = await asyncio.gather(*(client.infer("linear", [one_input(x)]) for x in xs))
    for x, answer in zip(xs, answers, strict=True):
        np.testing.assert_allclose(answer.as_numpy("OUTPUT0"), expected(x), rtol=1e-6)


def test_health_metadata_and_config(server: LiveServer) -> None:
    client = client_for(server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("linear") and client.is_model_ready("linear", "1")
    assert client.get_server_metadata().name == "batchserve"
    meta = client.get_model_metadata("linear", as_json=True)
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}]
    config = client.get_model_config("linear", as_json=True)["config"]
    http = httpx.get(server.url + "/v2/models/linear/config").json()
    assert config["max_batch_size"] == http["max_batch_size"] == 32
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["dynamic_batching"]["priority_levels"] == "2"  # uint64: a string in JSON
    with pytest.raises(InferenceServerException, match="unknown model") as missing:
        client.get_model_metadata("nope")
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    for name in ("linear/versions/1", "", ".."):  # never another route's path
        with pytest.raises(InferenceServerException, match="is not a model name") as bad:
            client.get_model_metadata(name)
        assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert not client.is_model_ready(name)  # as HTTP's ready route answers 404
    assert not client.is_model_ready("linear", "..")


def test_the_health_service_answers_per_model(server: LiveServer) -> None:
    assert server.grpc_url is not None
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(server.grpc_url))
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in ("", "inference.GRPCInferenceService", "linear"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == serving
    assert code_of(lambda: health.Check(health_pb2.HealthCheckRequest(service="nope"))) \
        == grpc.StatusCode.NOT_FOUND
    first = next(iter(health.Watch(health_pb2.HealthCheckRequest(service="linear"))))
    assert first.status == serving


@pytest.mark.asyncio
async def test_a_health_check_is_not_taken_behind_a_burst_of_inference_calls(
        server: LiveServer) -> None:
    """grpcio's asyncio server takes a method's next call only once its last was handed over, a
    pass of the event loop or more each: a health check sent after 40 inference calls, while
    every pass of the server's loop takes 5 ms at least, is taken in its own method's turn
    (registered methods, app/grpc/listener.py) and answered before most of them; as one of
    the generic handler's calls it waited behind all 40."""
    assert server.grpc_url is not None
    loop = server.app.state.service._loop
    busy = threading.Event()
    busy.set()

    def hold() -> None:
        if busy.is_set():
            time.sleep(0.005)
            loop.call_soon(hold)

    request = pb.ModelInferRequest(model_name="linear")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4],
                       contents=pb.InferTensorContents(fp32_contents=[1.0, 2.0, 3.0, 4.0]))
    finished: list[str] = []
    async with grpc.aio.insecure_channel(server.grpc_url) as channel:
        infer, health = GRPCInferenceServiceStub(channel), health_pb2_grpc.HealthStub(channel)

        async def call(what: str) -> None:
            if what == "infer":
                await infer.ModelInfer(request, timeout=60)
            else:
                await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=60)
            finished.append(what)

        await call("check")  # the channel is up
        finished.clear()
        loop.call_soon_threadsafe(hold)
        try:
            infers = [asyncio.create_task(call("infer")) for _ in range(40)]
            await asyncio.sleep(0.1)  # all 40 sent before the check
            await asyncio.gather(*infers, call("check"))
        finally:
            busy.clear()
    assert finished.count("infer") == 40
    assert finished.index("check") < 20


@pytest.mark.parametrize(("build", "message"), [
    (lambda r: r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3],
                            contents=pb.InferTensorContents(fp32_contents=[0.0] * 3)),
     r"expected shape \[4\], got \[3\]"),
    (lambda r: r.inputs.add(name="X", datatype="FP32", shape=[1, 4]), "unexpected inference input"),
    (lambda r: r.inputs.add(name="INPUT0", datatype="INT64", shape=[1, 4],
                            contents=pb.InferTensorContents(int64_contents=[0] * 4)),
     "data-type is 'INT64'"),
    (lambda r: r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4],
                            contents=pb.InferTensorContents(fp32_contents=[0.0] * 3)),
     r"3 values in fp32_contents do not fill shape"),
    (lambda r: r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4],
                            contents=pb.InferTensorContents(int_contents=[1] * 4)),
     "FP32 data comes in fp32_contents, not in int_contents"),
    (lambda r: (r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4]),
                r.raw_input_contents.append(b"\0" * 15)), "15 bytes do not hold shape"),
    (lambda r: (r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4]),
                r.raw_input_contents.append(np.array([[1, np.nan, 0, 0]], "<f4").tobytes())),
     "row 0 holds a NaN"),
    (lambda r: r.inputs.add(name="INPUT0", datatype="FP32", shape=[9, 4],
                            contents=pb.InferTensorContents(fp32_contents=[0.0] * 36)),
     "limit of 8"),
    (lambda r: (r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4],
                             contents=pb.InferTensorContents(fp32_contents=[0.0] * 4)),
                r.outputs.add(name="NOPE")), "unexpected inference output 'NOPE'"),
    (lambda r: (r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4],
                             contents=pb.InferTensorContents(fp32_contents=[0.0] * 4)),
                r.parameters["priority"].CopyFrom(pb.InferParameter(string_param="high"))),
     "parameter 'priority' must be a whole number"),
    (lambda r: None, "expected 1 input tensor"),
    # A message quoting 100,000 characters is cut (gRPC clients refuse a status over 16 KiB).
    (lambda r: r.inputs.add(name="I" * 100_000, datatype="FP32", shape=[1, 4]),
     r"^unexpected inference input 'I{700,} \.\.\. \(\d+ characters cut\) \.\.\. I+' for model "
     r"'linear'; it has 'INPUT0'$"),
])
def test_client_mistakes_are_invalid_argument(server: LiveServer, build: object,
                                              message: str) -> None:
    registry = server.app.state.service.metrics.registry

    def refused() -> float:  # 400, or 413 for too many rows, as over HTTP
        return sum(sample(registry, "batchserve_requests_total", protocol="grpc", status=status)
                   for status in ("400", "413"))

    before = refused()
    request = pb.ModelInferRequest(model_name="linear")
    build(request)  # type: ignore[operator]
    with pytest.raises(grpc.RpcError) as failed:
        stub(server).ModelInfer(request)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert re.search(message, failed.value.details())  # type: ignore[attr-defined]
    assert refused() - before == 1


@pytest.mark.parametrize(("path", "message"), [
    ("inference.GRPCInferenceService/ModelInfer", "inference.ModelInferRequest"),
    ("inference.GRPCInferenceService/ServerLive", "inference.ServerLiveRequest"),
    ("inference.GRPCInferenceService/RepositoryModelLoad", "inference.RepositoryModelLoadRequest"),
    ("grpc.health.v1.Health/Check", "grpc.health.v1.HealthCheckRequest"),
    ("grpc.health.v1.Health/Watch", "grpc.health.v1.HealthCheckRequest"),
])
def test_bytes_that_are_not_the_message_are_invalid_argument(
        server: LiveServer, path: str, message: str, caplog: pytest.LogCaptureFixture) -> None:
    assert server.grpc_url is not None
    channel = grpc.insecure_channel(server.grpc_url)
    kind = channel.unary_stream if path.endswith("Watch") else channel.unary_unary
    call = kind(f"/{path}", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as failed:
        answer = call(b"\x12\xe9li/ear", timeout=10)  # a length past the end of the bytes
        if path.endswith("Watch"):  # a stream: the status comes with its first read
            next(iter(answer))
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert failed.value.details() == (  # type: ignore[attr-defined]
        f"the request is not a valid {message} message")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback


def test_priority_and_timeout_parameters(server: LiveServer) -> None:
    client = client_for(server)
    x = np.ones((1, 4), dtype=np.float32)
    for priority in (1, 2, 0):
        got = client.infer("linear", [one_input(x)], priority=priority, timeout=60_000_000)
        np.testing.assert_allclose(got.as_numpy("OUTPUT0"), expected(x), rtol=1e-6)
    with pytest.raises(InferenceServerException, match="priority 7 is out of range"):
        client.infer("linear", [one_input(x)], priority=7)
    with pytest.raises(InferenceServerException) as refused:  # one microsecond: too late
        client.infer("linear", [one_input(x)], timeout=1)
    assert refused.value.status() in ("StatusCode.UNAVAILABLE",
                                      "StatusCode.DEADLINE_EXCEEDED"), refused.value


def test_request_id_comes_back(server: LiveServer) -> None:
    request = pb.ModelInferRequest(model_name="linear")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4],
                       contents=pb.InferTensorContents(fp32_contents=[0.0] * 4))
    _, call = stub(server).ModelInfer.with_call(request, metadata=[("x-request-id", "abc-123")])
    assert ("x-request-id", "abc-123") in list(call.trailing_metadata())


def test_text_model_with_bytes() -> None:
    from app.models.minilm import MiniLMHandler

    with live_server(make_settings(model="minilm"), MiniLMHandler(), grpc=True) as srv:
        assert client_for(srv).get_model_config("minilm").config.input[0].data_type \
            == model_config_pb2.TYPE_STRING
        texts = np.array([b"Hello, world.", "Übung".encode()], dtype=object)
        inp = triton.InferInput("INPUT0", [2], "BYTES")
        inp.set_data_from_numpy(texts)
        got = client_for(srv).infer("minilm", [inp]).as_numpy("OUTPUT0")
        request = pb.ModelInferRequest(model_name="minilm")
        request.inputs.add(name="INPUT0", datatype="BYTES", shape=[2],
                           contents=pb.InferTensorContents(bytes_contents=list(texts)))
        typed = stub(srv).ModelInfer(request)
        r = httpx.post(srv.url + "/predict", json={"instances": ["Hello, world.", "Übung"]})
    assert got.shape == (2, 384)
    want = np.array(r.json()["predictions"], dtype=np.float32)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(
        np.frombuffer(typed.raw_output_contents[0], "<f4").reshape(2, 384), want, atol=1e-6)


def test_repository_load_and_unload(tmp_path: Path) -> None:
    (tmp_path / "lin").mkdir()
    (tmp_path / "lin" / "config.toml").write_text('model = "linear"\n')
    (tmp_path / "scale" / "1").mkdir(parents=True)
    export_scale(tmp_path / "scale" / "1" / "model.pt2", 3.0)
    settings = make_settings(model_repository=str(tmp_path), model_control_mode="explicit",
                             load_model=["lin"], api_key="s3cret")
    with live_server(settings, grpc=True) as srv:
        client = client_for(srv)
        auth = {"authorization": "Bearer s3cret"}
        with pytest.raises(InferenceServerException, match="bearer") as denied:
            client.load_model("scale")
        assert denied.value.status() == "StatusCode.UNAUTHENTICATED"
        client.load_model("scale", headers=auth)
        assert client.is_model_ready("scale")
        index = client.get_model_repository_index(as_json=True)["models"]
        assert {(m["name"], m.get("state")) for m in index} >= {("scale", "READY")}
        x = np.ones((2, 3), dtype=np.float32)
        got = client.infer("scale", [one_input(x)], headers=auth).as_numpy("OUTPUT0")
        np.testing.assert_allclose(got, 3 * x)
        with pytest.raises(InferenceServerException) as unauth:
            client.infer("scale", [one_input(x)])
        assert unauth.value.status() == "StatusCode.UNAUTHENTICATED"
        client.load_model("scale", config=json.dumps({"max_batch_size": 2}), headers=auth)
        assert client.get_model_config("scale").config.max_batch_size == 2
        client.unload_model("scale", headers=auth)
        assert not client.is_model_ready("scale")
        with pytest.raises(InferenceServerException) as gone:
            client.infer("scale", [one_input(x)], headers=auth)
        assert gone.value.status() == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException, match="nope") as bad:
            client.load_model("nope", headers=auth)
        assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException, match="file:1/model.pt") as files:
            client.load_model("scale", files={"file:1/model.pt": b"\x00weights"}, headers=auth)
        assert files.value.status() == "StatusCode.INVALID_ARGUMENT"  # as HTTP: not served


def test_a_model_still_loading_is_refused_after_the_key_and_counted(tmp_path: Path) -> None:
    """As over HTTP (tests/api/test_predict.py): a model whose code still builds is
    UNAVAILABLE "is loading" with the key, UNAUTHENTICATED without, counted under model=""."""
    for name, model in (("lin", "linear"), ("slow", "tests.fakes:slow_build")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(f'model = "{model}"\n')
    settings = make_settings(model_repository=str(tmp_path), model_control_mode="explicit",
                             load_model=["lin"], api_key="k")
    auth = {"authorization": "Bearer k"}
    x = np.ones((1, 2), dtype=np.float32)
    SlowBuild.reset()
    with live_server(settings, grpc=True) as srv, ThreadPoolExecutor(1) as pool:
        client = client_for(srv)
        load = pool.submit(client_for(srv).load_model, "slow", headers=auth)
        try:
            assert SlowBuild.entered.wait(WAIT_S)
            for headers, code in ((None, "UNAUTHENTICATED"), (auth, "UNAVAILABLE")):
                with pytest.raises(InferenceServerException) as refused:
                    client.infer("slow", [one_input(x)], headers=headers)
                assert refused.value.status() == f"StatusCode.{code}"
            assert "model 'slow' is loading" in refused.value.message()
        finally:
            SlowBuild.gate.set()
        load.result(WAIT_S)
        registry = srv.app.state.service.metrics.registry
        assert sample(registry, "batchserve_requests_total", model="", status="503",
                      protocol="grpc") == 1
        assert sample(registry, "batchserve_rejected_total", model="", reason="loading") == 1


def test_a_refusal_is_unavailable_at_once_with_its_reason() -> None:
    with live_server(make_settings(), grpc=True) as srv:
        srv.app.state.service.begin_drain()
        request = pb.ModelInferRequest(model_name="linear")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4],
                           contents=pb.InferTensorContents(fp32_contents=[0.0] * 4))
        with pytest.raises(grpc.RpcError) as refused:
            stub(srv).ModelInfer(request)
        failed = refused.value
        assert failed.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert "shutting down" in failed.details()  # type: ignore[attr-defined]
        trailers = list(failed.trailing_metadata())  # type: ignore[attr-defined]
        assert ("retry-after", "1") in trailers
        assert ("grpc-retry-pushback-ms", "1000") in trailers
        registry = srv.app.state.service.metrics.registry
        assert sample(registry, "batchserve_requests_total", protocol="grpc", status="503") == 1
        # A channel that retries UNAVAILABLE (as KServe's client's does) waits as told: a
        # second of pushback, where its own backoff would have waited at most 10 ms.
        policy = {"maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                  "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}
        config = json.dumps({"methodConfig": [{"name": [{}], "retryPolicy": policy}]})
        assert srv.grpc_url is not None
        with grpc.insecure_channel(srv.grpc_url, options=[("grpc.service_config", config)]
                                   ) as channel:
            started = time.monotonic()
            with pytest.raises(grpc.RpcError):
                GRPCInferenceServiceStub(channel).ModelInfer(request)
            assert time.monotonic() - started >= 1.0
        assert sample(registry, "batchserve_requests_total", protocol="grpc", status="503") == 3


async def held_stream(request: pb.ModelInferRequest) -> AsyncIterator[pb.ModelInferRequest]:
    """``request`` on a ModelStreamInfer stream that its client keeps open."""
    yield request
    await asyncio.Event().wait()


@pytest.mark.asyncio
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_cancelled_call_drops_its_queued_items(streamed: bool) -> None:
    """A ModelInfer call, or a stream, that its client cancels: its request still queued is
    dropped, never computed."""
    async with gated_calls() as (handler, srv, stub):
        infer = stub.ModelInfer
        first = infer(echo_request(1))
        await wait_until(handler.entered.is_set, "device busy")
        second = stub.ModelStreamInfer(held_stream(echo_request(5))) if streamed \
            else infer(echo_request(5))
        await wait_until(lambda: queued(srv) == 1, "queued")
        second.cancel()
        registry = srv.app.state.service.metrics.registry
        await wait_until(lambda: sample(registry, "batchserve_rejected_total",
                                        reason="disconnected") == 1, "cancel noticed")
        handler.gate.set()
        assert len((await first).raw_output_contents) == 1
        await infer(echo_request(6))
    assert handler.seen == [1.0, 6.0]


@pytest.mark.asyncio
async def test_a_stuck_device_thread_is_not_live_over_http_and_grpc() -> None:
    """A batch's call past ``device_timeout_s``: ``/v2/health/live`` 503 and ``ServerLive``
    false (tritonclient), health unhealthy, a new request refused at once; all back once the
    call returns, and the stuck request answered."""
    handler = GatedHandler()
    with live_server(make_settings(device_timeout_s=1), handler, grpc=True) as srv:
        client = client_for(srv)
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            first = asyncio.create_task(http.post("/predict", json={"instances": [1]}))
            await wait_until(lambda: httpx.get(srv.url + "/v2/health/live").status_code == 503,
                             "not live")
            assert httpx.get(srv.url + "/v2/health/live").json() == {"live": False}
            assert not client.is_server_live()
            assert httpx.get(srv.url + "/health_check").json()["status"] == "unhealthy"
            refused = await http.post("/predict", json={"instances": [2]})
            assert refused.status_code == 503
            assert refused.json()["error"]["type"] == "unhealthy"
            handler.gate.set()
            assert (await first).json() == {"predictions": [2.0]}
            await wait_until(lambda: httpx.get(srv.url + "/v2/health/live").status_code == 200,
                             "live again")
            assert client.is_server_live()
    assert handler.seen == [1.0]


def test_grpc_port_in_use_is_one_line(tmp_path: Path) -> None:
    """Another program on the gRPC port: the server says so in one line and exits 2."""
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT, WAIT_S

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "app", "serve", "--model", "linear", "--port", "0",
             "--grpc-port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port} for gRPC" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_call_continues_the_callers_trace() -> None:
    from tests.otlp import PARENT_ID, TRACE_ID, TRACEPARENT, receiving

    with receiving() as receiver, \
            live_server(make_settings(otel_endpoint=receiver.url), grpc=True) as srv:
        x = np.ones((1, 4), dtype=np.float32)
        client_for(srv).infer("linear", [one_input(x)], headers={"traceparent": TRACEPARENT})
    (server,) = receiver.named("inference.GRPCInferenceService/ModelInfer")
    assert server.trace_id.hex() == TRACE_ID and server.parent_span_id.hex() == PARENT_ID
    children = [s for s in receiver.spans if s.parent_span_id == server.span_id]
    assert sorted(s.name for s in children) == ["device", "queue"]


def test_a_message_over_max_body_bytes_is_refused_by_grpc() -> None:
    with live_server(make_settings(max_body_bytes=1000), grpc=True) as srv:
        request = pb.ModelInferRequest(model_name="linear", raw_input_contents=[b"\0" * 2000])
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[125, 4])
        assert code_of(lambda: stub(srv).ModelInfer(request)) \
            == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert code_of(lambda: list(stub(srv).ModelStreamInfer(iter([request])))) \
            == grpc.StatusCode.RESOURCE_EXHAUSTED  # on a stream: it ends
        unserved = pb.TraceSettingRequest(model_name="linear")  # a call batchserve does not serve
        trace = grpc.insecure_channel(srv.grpc_url or "").unary_unary(
            "/inference.GRPCInferenceService/TraceSetting",
            request_serializer=pb.TraceSettingRequest.SerializeToString,
            response_deserializer=pb.TraceSettingResponse.FromString)
        assert code_of(lambda: trace(unserved)) == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.asyncio
async def test_calls_past_max_connections_are_refused() -> None:
    """``max_connections`` bounds the calls in flight in a process over gRPC as it bounds
    connections over HTTP: one more is refused at once, and taken once one has ended."""
    async with gated_calls(max_connections=2) as (handler, srv, stub):
        infer = stub.ModelInfer
        held = [infer(echo_request(1)), infer(echo_request(2))]
        await wait_until(handler.entered.is_set, "device busy")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await infer(echo_request(3))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("retry-after", "1") in list(refused.value.trailing_metadata())
        registry = srv.app.state.service.metrics.registry  # counted as HTTP would answer it
        assert sample(registry, "batchserve_rejected_total", model="", reason="connections") \
            == sample(registry, "batchserve_requests_total", model="", status="503",
                      protocol="grpc") == 1
        handler.gate.set()
        for call in held:
            assert (await call).raw_output_contents
        assert (await infer(echo_request(4))).raw_output_contents


def test_connections_past_max_connections_are_closed_and_http_serves_on() -> None:
    """gRPC core closes connections past ``max_connections``: a flood of idle ones (1,500
    took every descriptor of a process with Docker's soft limit, and HTTP's connections were
    closed unanswered) holds at most that many, and both protocols serve once it has gone."""
    settings = bytes(3) + b"\x04" + bytes(5)  # an empty SETTINGS frame (HTTP/2)
    preface, ack = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings, bytes(3) + b"\x04\x01" + bytes(4)
    with live_server(make_settings(max_connections=4), grpc=True) as srv:
        host, port = (srv.grpc_url or "").rsplit(":", 1)
        flood = [socket.create_connection((host, int(port)), timeout=WAIT_S) for _ in range(8)]
        for conn in flood:
            conn.sendall(preface)
        for conn in flood:  # the server's SETTINGS acknowledged: gRPC keeps such a one open
            with contextlib.suppress(OSError):
                if conn.recv(65536):
                    conn.sendall(ack)

        def closed(conn: socket.socket) -> bool:
            conn.setblocking(False)
            try:
                while conn.recv(65536):  # the server's SETTINGS, then nothing: open
                    pass
            except BlockingIOError:
                return False
            except OSError:  # reset
                return True
            return True  # end of stream

        wait_until_sync(lambda: sum(map(closed, flood)) >= 4, "connections past 4 closed")
        assert sum(not closed(conn) for conn in flood) <= 4
        assert httpx.post(srv.url + "/predict", json={"instances": [[1, 2, 3, 4]]},
                          timeout=WAIT_S).status_code == 200
        for conn in flood:
            conn.close()
        wait_until_sync(lambda: _serves(srv), "a gRPC call once the flood has gone")


def test_calls_whose_message_never_comes_are_bounded_too() -> None:
    """A call holds the server's memory from its headers on, before its message comes (and
    the call limit sees it): 20,000 such streams on one connection took 422 MB. Past twice
    ``max_connections`` of them, gRPC refuses new calls RESOURCE_EXHAUSTED at once."""
    with live_server(make_settings(max_connections=2), grpc=True) as srv:
        channel = grpc.insecure_channel(srv.grpc_url or "")
        waiting = channel.stream_unary(  # a stream of messages: its first is held back
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString)
        def once_released(release: threading.Event) -> Iterator[pb.ModelInferRequest]:
            release.wait(WAIT_S)
            request = pb.ModelInferRequest(model_name="linear", raw_input_contents=[
                np.ones(4, np.float32).tobytes()])
            request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
            yield request

        releases = [threading.Event() for _ in range(6)]
        calls = [waiting.future(once_released(release)) for release in releases]
        wait_until_sync(lambda: sum(c.done() for c in calls) >= 2, "calls past 4 refused")
        refused = [c for c in calls if c.done()]
        assert len(refused) == 2
        assert {c.code() for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        for call, release in zip(calls, releases, strict=True):
            release.set()
            if call not in refused:  # each held one, answered once its message came (one at
                assert call.result(WAIT_S).raw_output_contents  # a time: 2 may be in flight)


def _serves(srv: LiveServer) -> bool:
    try:
        return bool(client_for(srv).is_server_live(client_timeout=2))
    except InferenceServerException:
        return False


def test_sigterm_answers_the_calls_accepted_then_exits_0(tmp_path: Path) -> None:
    """SIGTERM: calls already queued are answered, a new one is refused (draining), exit 0; on
    a stream that stays open too, in its order, and the open stream does not hold the exit."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.conftest import WAIT_S, free_port, serve, wait_ready, wait_until_sync

    gate = tmp_path / "gate"
    port = free_port()
    target = f"127.0.0.1:{port}"
    with serve("--model", "tests.fakes:gate_file_module", "--devices", "cpu",
               "--grpc-port", str(port), env={"GATE_FILE": str(gate)}) as (proc, url), \
            ThreadPoolExecutor(3) as pool:
        wait_ready(url)

        def infer(i: int) -> np.ndarray:
            inp = triton.InferInput("INPUT0", [1, 2], "FP32")
            inp.set_data_from_numpy(np.full((1, 2), float(i), np.float32))
            client = triton.InferenceServerClient(target)
            return client.infer("gate_file_module", [inp]).as_numpy("OUTPUT0")

        futures = [pool.submit(infer, i) for i in range(3)]
        streamed: queue.Queue[tuple[Any, Any]] = queue.Queue()
        stream = triton.InferenceServerClient(target)
        stream.start_stream(callback=lambda result, error: streamed.put((result, error)))
        stream.async_stream_infer("gate_file_module", [one_input(np.full((1, 2), 5.0,
                                                                           np.float32))])
        wait_until_sync(lambda: sample(httpx.get(url + "/metrics").text,
                                       "batchserve_in_flight_requests") == 4, "4 calls in")
        proc.send_signal(signal.SIGTERM)
        wait_until_sync(lambda: httpx.get(url + "/health_check").json()["status"] == "draining",
                        "draining")
        with pytest.raises(InferenceServerException, match="shutting down") as late:
            infer(9)
        assert late.value.status() == "StatusCode.UNAVAILABLE"
        stream.async_stream_infer("gate_file_module", [one_input(np.full((1, 2), 9.0,
                                                                           np.float32))])
        gate.touch()
        assert [f.result().tolist() for f in futures] == [[[2 * i, 2 * i]] for i in range(3)]
        assert proc.wait(WAIT_S) == 0
        first, refused = streamed.get(timeout=WAIT_S), streamed.get(timeout=WAIT_S)
        assert first[0].as_numpy("OUTPUT0").tolist() == [[10.0, 10.0]]
        assert refused[0] is None and "shutting down" in refused[1].message()
        stream.stop_stream(cancel_requests=True)


@pytest.mark.asyncio
async def test_the_grpc_deadline_bounds_the_request() -> None:
    """A call whose gRPC deadline passes while queued ends DEADLINE_EXCEEDED, is counted once
    and its item is never computed. It counts as 504 where the server's deadline passes first,
    and as 499 where the client's own cancel at its deadline arrives before the server's
    passes: the server's began when the call reached it, later (on a loaded box, a few ms)."""
    async with gated_calls() as (handler, srv, stub):
        infer = stub.ModelInfer
        first = infer(echo_request(1))
        await wait_until(handler.entered.is_set, "device busy")
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await infer(echo_request(5), timeout=0.3)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        registry = srv.app.state.service.metrics.registry

        def counted(status: str) -> float:
            return sample(registry, "batchserve_requests_total", protocol="grpc", status=status)

        await wait_until(lambda: counted("504") + counted("499") == 1, "counted")
        handler.gate.set()
        await first
        await infer(echo_request(6))
    assert handler.seen == [1.0, 6.0] and counted("504") + counted("499") == 1


def test_an_int64_model_takes_raw_and_typed_contents() -> None:
    """A handler's INT64 input over gRPC: raw bytes (tritonclient) and int64_contents."""
    with live_server(make_settings(model="tests.fakes:IdsHandler"), IdsHandler(),
                     grpc=True) as srv:
        x = np.array([[1, 2, 3, 4], [2**60 + 1, 0, 0, 1]], dtype=np.int64)
        inp = triton.InferInput("INPUT0", [2, 4], "INT64")
        inp.set_data_from_numpy(x)
        got = client_for(srv).infer("ids", [inp]).as_numpy("OUTPUT0")
        assert got.dtype == np.int64 and got.tolist() == [10, 2**60 + 2]
        request = pb.ModelInferRequest(model_name="ids")
        request.inputs.add(name="INPUT0", datatype="INT64", shape=[2, 4],
                           contents=pb.InferTensorContents(int64_contents=x.reshape(-1)))
        answer = stub(srv).ModelInfer(request)
        assert np.frombuffer(answer.raw_output_contents[0], "<i8").tolist() == [10, 2**60 + 2]
        wrong = pb.ModelInferRequest(model_name="ids")
        wrong.inputs.add(name="INPUT0", datatype="INT64", shape=[1, 4],
                         contents=pb.InferTensorContents(int_contents=[1, 2, 3, 4]))
        with pytest.raises(grpc.RpcError) as failed:
            stub(srv).ModelInfer(wrong)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
