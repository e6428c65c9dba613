"""Models loaded and unloaded while clients call them, through two front ends, over HTTP and
gRPC, with clients that leave mid-body: every call gets one answer of a kind a client may
expect (never a 500 nor INTERNAL), the server logs no traceback, and /metrics counts each
call once, at the status its client was answered with. A rolling update refuses nothing."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time
from pathlib import Path

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceStub

from tests.conftest import free_port, sample, serve, split_server, wait_ready
from tests.fakes import export_scale

pytestmark = pytest.mark.slow

SECONDS = 6.0
MODELS = ("a", "b", "nosuch")  # a: linear; b: a model of fixed cost and a short queue
WIDTH = {"a": 4, "b": 2, "nosuch": 2}
# The HTTP status each gRPC code of an infer stands for (as the metrics count it)
AS_HTTP = {"OK": 200, "NOT_FOUND": 404, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}


class Tally:
    def __init__(self) -> None:
        self.infer: dict[str, collections.Counter[int]] = {
            "http": collections.Counter(), "grpc": collections.Counter()}
        self.other: collections.Counter[tuple[str, str]] = collections.Counter()
        self.rude = 0


def v2_body(model: str) -> dict[str, object]:
    body: dict[str, object] = {"inputs": [{"name": "INPUT0", "shape": [1, WIDTH[model]],
                                           "datatype": "FP32", "data": [1.0] * WIDTH[model]}]}
    if random.random() < 0.2:  # some too short to be met: 504, or refused at once, 503
        body["parameters"] = {"timeout": random.choice([1000, 300000])}
    return body


def grpc_request(model: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, WIDTH[model]],
                       contents=pb.InferTensorContents(fp32_contents=[1.0] * WIDTH[model]))
    if random.random() < 0.2:
        request.parameters["timeout"].int64_param = random.choice([1000, 300000])
    return request


async def http_calls(url: str, end: float, tally: Tally) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        while time.monotonic() < end:
            model = random.choice(MODELS)
            answer = await client.post(f"{url}/v2/models/{model}/infer", json=v2_body(model))
            tally.infer["http"][answer.status_code] += 1


async def grpc_calls(target: str, end: float, tally: Tally) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = GRPCInferenceServiceStub(channel)
        while time.monotonic() < end:
            try:
                await stub.ModelInfer(grpc_request(random.choice(MODELS)))
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
            tally.infer["grpc"][AS_HTTP.get(code, 0)] += 1  # 0: a code it should not be


async def loads(url: str, end: float, tally: Tally) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        while time.monotonic() < end:
            model, action = random.choice("ab"), random.choice(["load", "unload"])
            answer = await client.post(f"{url}/v2/repository/models/{model}/{action}")
            tally.other[(action, str(answer.status_code))] += 1
            await asyncio.sleep(0.2)


async def probes(url: str, target: str, end: float, tally: Tally) -> None:
    """Metadata, configuration, statistics and readiness of each model, over both."""
    async with httpx.AsyncClient(timeout=30) as client, \
            grpc.aio.insecure_channel(target) as channel:
        stub = GRPCInferenceServiceStub(channel)
        while time.monotonic() < end:
            model = random.choice("ab")
            for path in ("", "/ready", "/config", "/stats"):
                answer = await client.get(f"{url}/v2/models/{model}{path}")
                tally.other[("http" + path, str(answer.status_code))] += 1
            for call, request in ((stub.ModelMetadata, pb.ModelMetadataRequest(name=model)),
                                  (stub.ModelConfig, pb.ModelConfigRequest(name=model)),
                                  (stub.ModelStatistics, pb.ModelStatisticsRequest(name=model)),
                                  (stub.ModelReady, pb.ModelReadyRequest(name=model))):
                try:
                    await call(request)
                    code = "OK"
                except grpc.aio.AioRpcError as exc:
                    code = exc.code().name
                tally.other[("grpc", code)] += 1


async def rude(url: str, end: float, tally: Tally) -> None:
    """Clients that send an infer's head and part of its body, then leave."""
    host, port = url.removeprefix("http://").split(":")
    while time.monotonic() < end:
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v2/models/b/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{\"inputs\"")
        await writer.drain()
        await asyncio.sleep(random.random() * 0.1)
        writer.close()
        await writer.wait_closed()
        tally.rude += 1


async def churn(url: str, target: str) -> Tally:
    tally = Tally()
    end = time.monotonic() + SECONDS
    await asyncio.gather(*[http_calls(url, end, tally) for _ in range(8)],
                         *[grpc_calls(target, end, tally) for _ in range(4)],
                         loads(url, end, tally), probes(url, target, end, tally),
                         rude(url, end, tally))
    return tally


def test_calls_while_models_load_and_unload_are_each_answered_and_counted_once(
        tmp_path: Path) -> None:
    for name, lines in (("a", 'model = "linear"\nqueue_capacity = 64\n'),
                        ("b", 'model = "tests.fakes:sleep_module"\nmax_batch_size = 4\n'
                              'queue_capacity = 16\n')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(lines)
    grpc_port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as stderr, split_server(
            "--model-repository", str(tmp_path), "--model-control-mode", "explicit",
            "--load-model", "a", "--frontends", "2", "--grpc-port", str(grpc_port),
            "--request-timeout-s", "3", env={"SLEEP_S": "0.01"},
            stderr=stderr.fileno()) as (_, url):
        tally = asyncio.run(churn(url, f"127.0.0.1:{grpc_port}"))
        text = httpx.get(url + "/metrics", timeout=10).text
    assert "Traceback" not in log.read_text(errors="replace")
    answered = {protocol: collections.Counter({status: int(sample(
        text, "batchserve_requests_total", protocol=protocol, status=str(status)))
        for status in (200, 404, 499, 503, 504)}) for protocol in ("http", "grpc")}
    assert +answered["grpc"] == +tally.infer["grpc"]  # each status its clients saw, as often
    assert sum(answered["grpc"].values()) == sum(tally.infer["grpc"].values())
    assert set(tally.infer["http"]) <= {200, 404, 503, 504}
    for status in (200, 504):  # what the clients that leave are never answered
        assert answered["http"][status] == tally.infer["http"][status]
    assert sum(answered["http"].values()) == sum(tally.infer["http"].values()) + tally.rude
    assert answered["http"][499] <= tally.rude
    assert {code for kind, code in tally.other if kind == "grpc"} <= {
        "OK", "NOT_FOUND", "UNAVAILABLE"}
    assert {code for kind, code in tally.other if kind != "grpc"} <= {"200", "404", "503"}
    assert tally.infer["http"][200] and tally.infer["grpc"][200] and tally.rude


async def rolling(url: str, reloads: int) -> collections.Counter[tuple[int, str]]:
    """Requests naming no version from 6 clients while a client reloads the model ``reloads``
    times, switching its versions: (status, the version that answered or the error)."""
    seen: collections.Counter[tuple[int, str]] = collections.Counter()
    done = asyncio.Event()

    async def calls() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while not done.is_set():
                x = [random.random() for _ in range(3)]
                answer = await client.post(f"{url}/v2/models/s/infer", json={"inputs": [
                    {"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": x}]})
                body = answer.json()
                if answer.status_code != 200:
                    seen[(answer.status_code, str(body.get("error")))] += 1
                    continue
                k = int(body["model_version"])  # version k computes x * k
                right = body["outputs"][0]["data"] == pytest.approx([k * v for v in x])
                seen[(200 if right else 0, body["model_version"])] += 1

    async def reload() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            for i in range(reloads):
                config = json.dumps({"versions": [1 + i % 2]} if i % 3 else {"versions": [1, 2]})
                answer = await client.post(f"{url}/v2/repository/models/s/load",
                                           json={"parameters": {"config": config}})
                assert answer.status_code == 200, answer.text
        done.set()

    await asyncio.gather(reload(), *[calls() for _ in range(6)])
    return seen


@pytest.mark.parametrize("frontends", [1, 2])
def test_a_rolling_update_refuses_nothing(tmp_path: Path, frontends: int) -> None:
    """Versions leave and take the default traffic while clients call the name: every request
    is answered by a version that serves it (none 503 unloading, 404 for a version gone, or
    loading while a front end makes the new version's handler), with that version's values;
    in one process too, where a request whose body came after the move was refused."""
    for version in (1, 2):
        export_scale(tmp_path / "s" / str(version) / "model.pt2", float(version))
    (tmp_path / "s" / "config.toml").write_text("versions = [1, 2]\n")
    args = ("--model-repository", str(tmp_path), "--model-control-mode", "explicit",
            "--load-model", "s", "--frontends", str(frontends))
    with (split_server(*args) if frontends > 1 else serve(*args)) as (_, url):
        wait_ready(url)
        seen = asyncio.run(rolling(url, 12))
    assert {status for status, _ in seen} == {200}, seen
    assert {version for _, version in seen} == {"1", "2"}
