"""POST /predict in-process (httpx + ASGITransport): status codes and error bodies."""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from app.api import predict
from app.facade import INLINE_DECODE_MAX_ITEMS
from app.models.base import decode_abandoned
from app.models.builtin import mlp_module
from app.models.tensor import TensorHandler
from tests.conftest import (
    WAIT_S,
    app_client,
    http_scope,
    make_settings,
    queued,
    sample,
    wait_until,
)
from tests.fakes import (
    EchoHandler,
    FailingHandler,
    GatedHandler,
    OOMHandler,
    SlowBuild,
    SlowLoadHandler,
    SteadyHandler,
)

pytestmark = pytest.mark.asyncio


def assert_error(response: object, status: int, type_: str, contains: str = "") -> dict:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"} and body["error"]["type"] == type_
    assert contains in body["error"]["message"]
    assert "Traceback" not in body["error"]["message"] and "/" not in body["error"]["message"]
    return body


async def test_linear_predicts() -> None:
    async with app_client(make_settings()) as client:
        r = await client.post("/predict", json={"instances": [[1, 2, 3, 4], [0, 0, 0, 0]]})
        assert r.status_code == 200
        preds = r.json()["predictions"]
        assert len(preds) == 2 and all(len(p) == 2 for p in preds)


async def test_wide_instances_are_parsed_straight_into_an_array(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Instances of more than 64 numbers skip Python's numbers (app/payload.py): same answers,
    and a near miss still gets the general path's 422 naming the instance."""
    handler = TensorHandler("wide", lambda d: mlp_module((100, 3)).to(d).eval(), (100,))
    rows = [[(i * 7 + j) % 11 / 4 - 1 for j in range(100)] for i in range(3)]
    general: list[bytes] = []
    parse_json = predict.parse_json
    monkeypatch.setattr(predict, "parse_json", lambda body: general.append(body) or
                        parse_json(body))
    async with app_client(make_settings(), handler) as client:
        r = await client.post("/predict", json={"instances": rows})
        assert r.status_code == 200 and general == []
        with torch.no_grad():
            expected = mlp_module((100, 3))(torch.tensor(rows)).numpy()
        np.testing.assert_allclose(r.json()["predictions"], expected, rtol=1e-5, atol=1e-6)
        r = await client.post("/predict", json={"instances": [rows[0], rows[1][:99] + [[1.0]]]})
        assert_error(r, 422, "invalid_input", "instances[1]")
        r = await client.post("/predict", json={"instances": [rows[0][:99] + [1e39]]})
        assert_error(r, 422, "invalid_input", "instances[0]: numbers must be finite")
        assert len(general) == 2  # the ragged body, and 1e39: past float32, named by decode


@pytest.mark.parametrize(("output", "datatype"), [
    (lambda y: y.t().contiguous().t(), "FP32"),  # the same values, column-major
    (lambda y: y.to(torch.bfloat16), "FP32"),  # numpy has no bfloat16
    (lambda y: y.half(), "FP16"),
])
async def test_outputs_a_model_may_return_are_answered(
    output: Callable[[torch.Tensor], torch.Tensor], datatype: str,
) -> None:
    """A transposed view, bfloat16, float16: 200 with their numbers on both APIs, not a 500
    (or a model that fails its warm-up)."""
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return output(x * 2)

    async with app_client(make_settings(), TensorHandler("t", lambda d: Model(), (3,))) as client:
        r = await client.post("/predict", json={"instances": [[1, 2, 3], [4, 5, 6]]})
        assert r.status_code == 200, r.text
        assert r.json()["predictions"] == [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]
        r = await client.post("/v2/models/t/infer", json={"inputs": [
            {"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
        assert r.status_code == 200, r.text
        out, = r.json()["outputs"]
        assert out["datatype"] == datatype and out["data"] == [2.0, 4.0, 6.0]


async def test_outputs_that_are_not_finite_are_null_in_json_and_as_computed_in_binary() -> None:
    """JSON has no NaN or infinity: such an output number is null in a JSON answer (200, the
    others as they are); a binary v2 output carries it as the model computed it."""
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x)  # log 1 = 0, log 0 = -inf, log -1 = nan

    instance = {"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 0, -1]}
    async with app_client(make_settings(), TensorHandler("t", lambda d: Model(), (3,))) as client:
        r = await client.post("/predict", json={"instances": [[1, 0, -1]]})
        assert r.status_code == 200 and r.json()["predictions"] == [[0.0, None, None]]
        r = await client.post("/v2/models/t/infer", json={"inputs": [instance]})
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [0.0, None, None]
        r = await client.post("/v2/models/t/infer", json={
            "inputs": [instance], "parameters": {"binary_data_output": True}})
        assert r.status_code == 200, r.text
        raw = np.frombuffer(r.content[int(r.headers["inference-header-content-length"]):],
                            dtype=np.float32)
        assert raw[0] == 0.0 and raw[1] == -np.inf and np.isnan(raw[2]) and raw.size == 3


@pytest.mark.parametrize(
    ("body", "contains"),
    [
        (b"not json", "not valid JSON"),
        (b"", "empty"),
        (b"[1, 2]", 'expected a JSON object {"instances"'),
        (b'{"inputs": [1]}', 'missing field "instances"'),
        (b'{"instances": 3}', "must be a list"),
        (b'{"instances": []}', "is empty"),
        (b'{"instances": [[1, 2, 3]]}', "instances[0]: expected shape [4], got [3]"),
        (b'{"instances": [[1, 2, 3, 4], "x"]}', "instances[1]"),
        (b'{"instances": [[1, 2, 3, NaN]]}', "not valid JSON"),
        (b'{"instances": [[1, 2, 3, 1e999]]}', "infinity"),
    ],
)
async def test_client_mistakes_get_422(body: bytes, contains: str) -> None:
    async with app_client(make_settings()) as client:
        r = await client.post("/predict", content=body)
        assert_error(r, 422, "invalid_input", contains)


async def test_content_type_is_not_trusted() -> None:
    """The body decides: JSON under another content type is read (curl -d sends form encoding);
    a form or text body is refused as not JSON, never a 415 or a 500."""
    async with app_client(make_settings()) as client:
        r = await client.post("/predict", content=b'{"instances": [[1, 2, 3, 4]]}',
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 200
        r = await client.post("/predict", content=b"instances=1&b=2",
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert_error(r, 422, "invalid_input", "not valid JSON")
        r = await client.post("/predict", content="[1, 2, 3, 4]".encode("utf-16"),
                              headers={"Content-Type": "text/plain; charset=utf-16"})
        assert_error(r, 422, "invalid_input", "not valid JSON")


async def test_a_compressed_body_is_inflated_within_the_limit() -> None:
    """Content-Encoding gzip or deflate (as Triton takes them) is undone before the body is
    read, and may not inflate past max_body_bytes; another encoding is a 415 naming those."""
    body = b'{"instances": [[1, 2, 3, 4]]}'
    async with app_client(make_settings(max_body_bytes=1000)) as client:
        plain = (await client.post("/predict", content=body)).json()
        for encoding, sent in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
            r = await client.post("/predict", content=sent,
                                  headers={"Content-Encoding": encoding})
            assert r.status_code == 200 and r.json() == plain
        r = await client.post("/predict", content=gzip.compress(b" " * 2000 + body),
                              headers={"Content-Encoding": "gzip"})
        assert_error(r, 413, "payload_too_large", "inflates to more than the limit of 1000")
        r = await client.post("/predict", content=body, headers={"Content-Encoding": "zstd"})
        assert_error(r, 415, "unsupported_encoding", "gzip, deflate or none")


async def test_limits_get_413() -> None:
    async with app_client(make_settings(max_body_bytes=1000, max_instances=4)) as client:
        r = await client.post("/predict", json={"instances": [[1, 2, 3, 4]] * 5})
        assert_error(r, 413, "payload_too_large", "limit of 4")
        # One instance's numbers without its brackets: past the limit as instances, but the
        # mistake named is the instance's shape.
        r = await client.post("/predict", json={"instances": [1, 2, 3, 4, 5]})
        assert_error(r, 422, "invalid_input", "instances[0]: expected shape [4], got []")
        r = await client.post("/predict", content=b'{"instances": [' + b"1," * 2000 + b"1]}")
        assert_error(r, 413, "payload_too_large", "1000 bytes")


async def test_oversized_stream_is_refused_before_it_is_read_whole() -> None:
    """No Content-Length, an endless body: 413 once the limit is passed, the rest never read."""
    limit, chunk = 10_000, b"[" * 1000
    read = 0

    async def receive() -> dict:
        nonlocal read
        read += 1
        if read > 10_000:  # 10 MB: far past the limit; reaching it means the body was slurped
            raise AssertionError("the server kept reading")
        return {"type": "http.request", "body": chunk, "more_body": True}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async with app_client(make_settings(max_body_bytes=limit)) as client:
        for path in ("/predict", "/v2/models/linear/infer"):
            read, sent = 0, []
            app = client.app  # type: ignore[attr-defined]
            await app(http_scope(path, app), receive, send)
            assert sent[0]["status"] == 413
            assert read <= limit // len(chunk) + 1


async def test_client_gone_mid_body_is_counted_not_an_error() -> None:
    """A client that disconnects while sending its body: counted as disconnected, no 500."""
    messages = [{"type": "http.request", "body": b'{"instances": [[1, ', "more_body": True},
                {"type": "http.disconnect"}]

    async def receive() -> dict:
        return messages.pop(0)

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async with app_client(make_settings()) as client:
        app = client.app  # type: ignore[attr-defined]
        await app(http_scope("/predict", app), receive, send)
        registry = app.state.service.metrics.registry
        assert sent[0]["status"] == 499
        assert sample(registry, "batchserve_rejected_total", reason="disconnected") == 1
        assert sample(registry, "batchserve_requests_total", status="500") == 0
        assert app.state.service.in_flight == 0


async def test_timeout_header() -> None:
    async with app_client(make_settings()) as client:
        r = await client.post("/predict", json={"instances": [[1, 2, 3, 4]]},
                              headers={"X-Request-Timeout": "abc"})
        assert_error(r, 422, "invalid_input", "x-request-timeout")
        r = await client.post("/predict", json={"instances": [[1, 2, 3, 4]]},
                              headers={"X-Request-Timeout": "5"})
        assert r.status_code == 200


async def test_deadline_gives_504() -> None:
    handler = GatedHandler()
    async with app_client(make_settings(), handler) as client:
        first = asyncio.create_task(client.post("/predict", json={"instances": [1]}))
        await wait_until(handler.entered.is_set, "device busy")
        r = await client.post("/predict", json={"instances": [2]},
                              headers={"X-Request-Timeout": "0.05"})
        assert_error(r, 504, "timeout", "deadline")
        handler.gate.set()
        assert (await first).status_code == 200


class PoolDecodeGate(GatedHandler):
    """A request of more than ``INLINE_DECODE_MAX_ITEMS`` instances is decoded in the pool, where
    this decode waits for ``release``, then records whether its request was answered without
    it (``abandoned``)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_pool = threading.Event()
        self.release = threading.Event()
        self.abandoned: list[bool] = []

    def decode(self, instances: list[Any]) -> list[Any]:
        if len(instances) > INLINE_DECODE_MAX_ITEMS:
            self.in_pool.set()
            if not self.release.wait(timeout=60):
                raise RuntimeError("never released")
            self.abandoned.append(decode_abandoned())
        return super().decode(instances)


async def test_admission_is_checked_again_after_a_decode_in_the_pool() -> None:
    """The queue had room when the request arrived and fills while its decode runs in the pool
    (an inline decode lets nothing run in between): it is refused whole, not queued past the
    capacity."""
    big = INLINE_DECODE_MAX_ITEMS + 1
    handler = PoolDecodeGate()
    settings = make_settings(queue_capacity=big, max_instances=big)
    async with app_client(settings, handler) as client:
        first = asyncio.create_task(client.post("/predict", json={"instances": [1]}))
        await wait_until(handler.entered.is_set, "device busy")
        large = asyncio.create_task(client.post("/predict", json={"instances": [2] * big}))
        await wait_until(handler.in_pool.is_set, "decoding in the pool")
        small = asyncio.create_task(client.post("/predict", json={"instances": [3]}))
        await wait_until(lambda: queued(client) == 1, "one queued")
        handler.release.set()
        assert_error(await large, 503, "busy", "queue is full")
        assert handler.abandoned == [False]  # its request still waited for it
        handler.gate.set()
        assert [(await t).status_code for t in (first, small)] == [200, 200]
        assert queued(client) == 0


async def test_a_decode_in_the_pool_past_the_deadline_is_answered_504_at_the_deadline() -> None:
    """The wait for a decode is bounded by the request's deadline: a decode that never returns
    (stuck on its input) leaves no request unanswered; the request path serves on. The decode
    is told its request has been answered (``decode_abandoned``), so a long one may stop."""
    big = INLINE_DECODE_MAX_ITEMS + 1
    handler = PoolDecodeGate()
    settings = make_settings(queue_capacity=big, max_instances=big)
    async with app_client(settings, handler) as client:
        r = await client.post("/predict", json={"instances": [2] * big},
                              headers={"X-Request-Timeout": "0.2"})
        assert_error(r, 504, "timeout", "deadline passed while it was decoded")
        assert handler.in_pool.is_set() and not handler.release.is_set()  # still decoding
        handler.gate.set()
        r = await client.post("/predict", json={"instances": [3]})
        assert r.json()["predictions"] == [6]
        handler.release.set()
        await wait_until(lambda: handler.abandoned, "the decode's end")
        assert handler.abandoned == [True]
        registry = client.app.state.service.metrics.registry  # type: ignore[attr-defined]
        assert sample(registry, "batchserve_rejected_total", reason="timeout") == 1


async def test_a_client_that_leaves_while_its_request_decodes_in_the_pool_is_let_go() -> None:
    """A client gone while its decode runs in the pool is answered 499 (counted disconnected)
    without waiting for the decode, which runs on, told so (``decode_abandoned``), its outcome
    dropped: nothing is queued."""
    big = INLINE_DECODE_MAX_ITEMS + 1
    handler = PoolDecodeGate()
    gone = asyncio.Event()
    body = orjson.dumps({"instances": [2] * big})
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    settings = make_settings(queue_capacity=big, max_instances=big)
    async with app_client(settings, handler) as client:
        app = client.app  # type: ignore[attr-defined]
        answered = asyncio.create_task(app(http_scope("/predict", app), receive, send))
        await wait_until(handler.in_pool.is_set, "the decode in the pool")
        gone.set()
        await asyncio.wait_for(answered, WAIT_S)
        assert sent[0]["status"] == 499 and not handler.release.is_set()  # still decoding
        registry = app.state.service.metrics.registry
        assert sample(registry, "batchserve_rejected_total", reason="disconnected") == 1
        handler.release.set()
        await wait_until(lambda: handler.abandoned, "the decode's end")
        assert handler.abandoned == [True]
        handler.gate.set()
        r = await client.post("/predict", json={"instances": [3]})
        assert r.json()["predictions"] == [6]
        assert handler.seen == [3] and app.state.service.in_flight == 0


class SmallInline(EchoHandler):
    """A heavy decode whose one-instance requests are cheap: each decode's thread, recorded."""

    heavy_decode = True

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def decodes_inline(self, instances: list[Any]) -> bool:
        return len(instances) == 1

    def decode(self, instances: list[Any]) -> list[Any]:
        self.threads.append(threading.current_thread().name)
        return super().decode(instances)


async def test_a_heavy_decode_runs_on_the_loop_where_the_handler_says_it_is_cheap() -> None:
    handler = SmallInline()
    async with app_client(make_settings(), handler) as client:
        for instances in ([1], [1, 2]):
            r = await client.post("/predict", json={"instances": instances})
            assert r.status_code == 200 and r.json()["predictions"] == [2 * x for x in instances]
    loop_thread = threading.current_thread().name
    assert handler.threads[-2] == loop_thread and handler.threads[-1].startswith("decode")


class Tripling(EchoHandler):
    """Breaks the decode contract: three items for every instance."""

    def decode(self, instances: list[Any]) -> list[Any]:
        return super().decode(instances * 3)


async def test_a_decode_that_adds_items_is_admitted_for_what_it_queues() -> None:
    """The check before decoding saw one instance; the three items it became are checked again
    (a full queue refuses them whole, never a partial put)."""
    settings = make_settings(queue_capacity=2, max_instances=1)
    async with app_client(settings, Tripling()) as client:
        assert_error(await client.post("/predict", json={"instances": [1]}), 503, "busy")
        assert queued(client) == 0


async def test_model_failure_gives_500_and_serving_goes_on() -> None:
    async with app_client(make_settings(), FailingHandler()) as client:
        r = await client.post("/predict", json={"instances": [1, -1]})
        body = assert_error(r, 500, "model_error")
        assert "secret" not in body["error"]["message"]
        r = await client.post("/predict", json={"instances": [3]})
        assert r.status_code == 200 and r.json() == {"predictions": [6.0]}


async def test_busy_gives_503_with_retry_after() -> None:
    handler = GatedHandler()
    async with app_client(make_settings(queue_capacity=2, max_instances=2), handler) as client:
        first = asyncio.create_task(client.post("/predict", json={"instances": [1]}))
        await wait_until(handler.entered.is_set, "device busy")
        held = asyncio.create_task(client.post("/predict", json={"instances": [2, 3]}))
        await wait_until(lambda: queued(client) == 2, "queue full")
        r = await client.post("/predict", json={"instances": [4]})
        assert_error(r, 503, "busy", "queue is full")
        assert r.headers["retry-after"] == "1"
        for params in ({}, {"model": "echo"}):  # the server, and the model alone
            health = await client.get("/health_check", params=params)
            assert health.status_code == 503 and health.json()["status"] == "busy"
            assert health.headers["retry-after"] == "1"
        handler.gate.set()
        assert [(await t).status_code for t in (first, held)] == [200, 200]


async def test_not_ready_gives_503_loading() -> None:
    handler = SlowLoadHandler()
    async with app_client(make_settings(), handler, wait_ready=False) as client:
        r = await client.post("/predict", json={"instances": [1]})
        assert_error(r, 503, "loading")
        assert r.headers["retry-after"] == "1"
        health = await client.get("/health_check")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        handler.loaded.set()
        await wait_until(lambda: client.app.state.service.status == "ready", "ready")
        assert (await client.post("/predict", json={"instances": [1]})).status_code == 200


async def test_a_model_still_loading_is_refused_after_the_key_and_counted(
        tmp_path: Path) -> None:
    """A request for a model whose code still builds (a repository load under way) is 503
    loading, counted under ``model=""`` as a request for no model is (it was counted nowhere);
    without the key it is 401, as for an unknown name (it was 503, telling the name)."""
    for name, model in (("lin", "linear"), ("slow", "tests.fakes:slow_build")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(f'model = "{model}"\n')
    settings = make_settings(model_repository=str(tmp_path), model_control_mode="explicit",
                             load_model=["lin"], api_key="k")
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                        "data": [1, 2]}]}
    key = {"Authorization": "Bearer k"}
    SlowBuild.reset()
    async with app_client(settings) as client:
        load = asyncio.ensure_future(client.post("/v2/repository/models/slow/load", headers=key))
        try:
            await wait_until(SlowBuild.entered.is_set, "the factory called")
            for path in ("/v2/models/slow/infer", "/models/slow/predict"):
                assert (await client.post(path, json=body)).status_code == 401
            refused = await client.post("/v2/models/slow/infer", json=body, headers=key)
            assert refused.status_code == 503
            assert refused.json() == {"error": "model 'slow' is loading"}
            text = (await client.get("/metrics")).text
        finally:
            SlowBuild.gate.set()
        assert (await load).status_code == 200
    assert sample(text, "batchserve_requests_total", model="", status="503") == 1
    assert sample(text, "batchserve_requests_total", model="", status="401") == 2
    assert sample(text, "batchserve_rejected_total", model="", reason="loading") == 1


async def test_api_key() -> None:
    BODY = {"instances": [[1, 2, 3, 4]]}  # noqa: N806
    async with app_client(make_settings(api_key="s3cret")) as client:
        r = await client.post("/predict", json=BODY)
        assert_error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        r = await client.post("/predict", json=BODY,
                              headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = await client.post("/predict", json=BODY,
                              headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        assert (await client.get("/health_check")).status_code == 200  # stays open
        assert (await client.get("/metrics")).status_code == 200
        v2_body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                              "data": [1, 2, 3, 4]}]}
        r = await client.post("/v2/models/linear/infer", json=v2_body)
        assert r.status_code == 401 and r.json() == {"error": "missing or invalid bearer token"}
        r = await client.post("/v2/models/linear/infer", json=v2_body,
                              headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200


async def test_unknown_route_and_method() -> None:
    async with app_client(make_settings()) as client:
        assert_error(await client.get("/nope"), 404, "not_found")
        assert_error(await client.get("/predict"), 405, "method_not_allowed")


async def test_openapi_documents_the_contract() -> None:
    async with app_client(make_settings()) as client:
        doc = (await client.get("/openapi.json")).json()
        post = doc["paths"]["/predict"]["post"]
        assert {"200", "413", "422", "500", "503", "504"} <= set(post["responses"])
        schema = post["requestBody"]["content"]["application/json"]["schema"]
        row = schema["properties"]["instances"]["items"]
        assert row["maxItems"] == 4 and row["items"]["maximum"] == float(np.finfo(np.float32).max)
        assert "/health_check" in doc["paths"]
        assert (await client.get("/docs")).status_code == 200
    # The request headers the inference routes read (v2's also in its body), nothing else.
    headers = {"X-Priority", "X-Request-Timeout"}
    for path in ("/predict", "/models/{name}/predict", "/models/{name}/versions/{version}/predict",
                 "/v2/models/{name}/infer"):
        parameters = doc["paths"][path]["post"]["parameters"]
        assert headers == {p["name"] for p in parameters if p["in"] == "header"}, path
        assert {p["name"] for p in parameters if p["in"] == "path"} <= {"name", "version"}
        assert all(p["in"] in ("header", "path") for p in parameters), path
    infer = doc["paths"]["/v2/models/{name}/infer"]["post"]
    # v2 answers every client mistake 400, never FastAPI's 422.
    assert {"200", "400", "413", "500", "503", "504"} <= set(infer["responses"])
    assert "422" not in infer["responses"]
    assert "/v2/models/{name}/versions/{version}/infer" not in doc["paths"]
    body = infer["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["parameters"]["properties"]["priority"]["type"] == "integer"


PREDICT_PATHS = ("/predict", "/models/{name}/predict", "/models/{name}/versions/{version}/predict")


def predict_contract(doc: dict[str, Any], path: str) -> tuple[Any, dict[str, Any]]:
    """A predict route's ``X-Priority`` maximum and per-instance schema, from an OpenAPI doc."""
    post = doc["paths"][path]["post"]
    priority, = (p for p in post["parameters"] if p["name"] == "X-Priority")
    assert priority["schema"]["minimum"] == 0
    body = post["requestBody"]["content"]["application/json"]["schema"]
    return priority["schema"].get("maximum"), body["properties"]["instances"]["items"]


async def test_every_predict_route_states_the_single_models_contract(tmp_path: Any) -> None:
    """A single ``--model`` is known when the schema is built and every predict route serves
    it: each states its levels (bounding X-Priority) and its instances. A repository's models
    differ, so there the routes state neither."""
    async with app_client(make_settings(priority_levels=3)) as client:
        doc = (await client.get("/openapi.json")).json()
    for path in PREDICT_PATHS:
        maximum, items = predict_contract(doc, path)
        assert maximum == 3 and items["minItems"] == items["maxItems"] == 4, path
    settings = make_settings(model_repository=str(tmp_path), model_control_mode="explicit")
    async with app_client(settings, wait_ready=False) as client:
        doc = (await client.get("/openapi.json")).json()
    for path in PREDICT_PATHS:
        assert predict_contract(doc, path) == (None, {}), path


@pytest.mark.parametrize(("header", "contains"), [
    ("3", "priority 3 is out of range: model 'linear' has levels 1 (most urgent) to 2"),
    ("high", "X-Priority must be a whole number"),
    ("-1", "X-Priority must be a whole number >= 0"),
    ("9" * 5000, "X-Priority must be a whole number >= 0, got '" + "9" * 40 + "...'"),
    ("9" * 18, "priority 999999999999999999 is out of range"),
])
async def test_a_bad_priority_is_refused_naming_the_range(header: str, contains: str) -> None:
    async with app_client(make_settings()) as client:
        for path in ("/predict", "/models/linear/predict"):
            r = await client.post(path, json={"instances": [[1, 2, 3, 4]]},
                                  headers={"X-Priority": header})
            assert_error(r, 422, "invalid_input", contains.replace("X-Priority", "x-priority"))


async def test_priorities_are_taken_from_the_header() -> None:
    async with app_client(make_settings()) as client:
        for level in ("1", "2", "0"):  # 0: the model's default
            r = await client.post("/predict", json={"instances": [[1, 2, 3, 4]]},
                                  headers={"X-Priority": level})
            assert r.status_code == 200


async def test_a_request_that_cannot_finish_in_time_gets_503_at_once() -> None:
    handler = SteadyHandler(cost_s=0.05)
    async with app_client(make_settings(max_batch_size=1), handler) as client:
        handler.gate.clear()
        held = [asyncio.create_task(client.post("/predict", json={"instances": [i]}))
                for i in range(4)]
        await wait_until(lambda: queued(client) >= 3, "a backlog")
        r = await client.post("/predict", json={"instances": [9]},
                              headers={"X-Request-Timeout": "0.1"})
        body = assert_error(r, 503, "deadline", "after the request's deadline")
        assert int(r.headers["retry-after"]) >= 1 and body
        handler.gate.set()
        assert [(await t).status_code for t in held] == [200] * 4
        registry = client.app.state.service.metrics.registry  # type: ignore[attr-defined]
        assert sample(registry, "batchserve_rejected_total", reason="deadline") == 1


async def test_booleans_are_not_numbers() -> None:
    """JSON true and false are refused where numbers are expected, on the dense path (which
    would read them as 1 and 0) as on the general one."""
    async with app_client(make_settings()) as client:
        for body in ({"instances": [[True, False, 1, 2]]},
                     {"instances": [[1, 2, 3, 4], [[1, 2], 3, True, 4]]}):
            r = await client.post("/predict", json=body)
            index = 0 if body["instances"][0][0] is True else 1
            assert_error(r, 422, "invalid_input", f"instances[{index}]: expected numbers")
        r = await client.post("/predict", json={"instances": [[1, 2, 3, 4]]})
        assert r.status_code == 200


async def test_a_model_too_big_for_large_batches_serves_with_the_limit_that_fits() -> None:
    """Out of memory above 2 items at warm-up: it loads with a batch limit of 2, says so in its
    configuration and the metric, and a request of 7 is split at serve time."""
    handler = OOMHandler(2, examples=[1.0])
    async with app_client(make_settings(max_batch_size=8), handler) as client:
        config = (await client.get("/v2/models/echo/config")).json()
        assert config["max_batch_size"] == 2
        metrics = (await client.get("/metrics")).text
        assert sample(metrics, "batchserve_effective_batch_limit", model="echo") == 2
        r = await client.post("/predict", json={"instances": [1, 2, 3, 4, 5, 6, 7]})
        assert r.status_code == 200 and r.json()["predictions"] == [2, 4, 6, 8, 10, 12, 14]
        assert max(handler.attempts[-4:]) <= 2


async def test_a_model_that_cannot_load_is_unhealthy_not_loading_for_ever() -> None:
    async with app_client(make_settings(), OOMHandler(0, examples=[1.0]),
                          wait_ready=False) as client:
        await wait_until(lambda: client.app.state.service.status == "unhealthy", "unhealthy")
        health = await client.get("/health_check")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
