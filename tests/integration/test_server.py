"""A real uvicorn server on a free loopback port, seen from outside over HTTP."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from tests.conftest import live_server, make_settings, queued, sample, wait_until
from tests.fakes import FailingHandler, GatedHandler

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_concurrent_requests_share_batches() -> None:
    handler = GatedHandler()
    with live_server(make_settings(), handler) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            first = asyncio.create_task(client.post("/predict", json={"instances": [0]}))
            await wait_until(handler.entered.is_set, "device busy")
            rest = [asyncio.create_task(client.post("/predict", json={"instances": [i]}))
                    for i in range(1, 9)]
            await wait_until(lambda: queued(srv) == 8, "8 queued")
            handler.gate.set()
            responses = await asyncio.gather(first, *rest)
            assert [r.json()["predictions"] for r in responses] == [[2.0 * i] for i in range(9)]
            text = (await client.get("/metrics")).text
    assert sample(text, "batchserve_batch_size_count") == 2
    assert sample(text, "batchserve_batch_size_sum") == 9  # 8 requests in one model call
    assert sample(text, "batchserve_batch_size_bucket", le="8.0") == 2


async def test_full_queue_busy_and_recovery() -> None:
    handler = GatedHandler()
    with live_server(make_settings(queue_capacity=3, max_instances=3), handler) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            first = asyncio.create_task(client.post("/predict", json={"instances": [0]}))
            await wait_until(handler.entered.is_set, "device busy")
            held = asyncio.create_task(client.post("/predict", json={"instances": [1, 2, 3]}))
            await wait_until(lambda: queued(srv) == 3, "queue full")
            r = await client.post("/predict", json={"instances": [4]})
            assert r.status_code == 503 and r.json()["error"]["type"] == "busy"
            assert r.headers["retry-after"] == "1"
            health = await client.get("/health_check")
            assert health.status_code == 503 and health.json()["status"] == "busy"
            handler.gate.set()
            assert [(await t).status_code for t in (first, held)] == [200, 200]
            assert (await client.get("/health_check")).json()["status"] == "ready"
            text = (await client.get("/metrics")).text
    assert 4.0 not in handler.seen
    assert sample(text, "batchserve_rejected_total", reason="busy") == 1
    assert sample(text, "batchserve_requests_total", status="503") == 1
    assert sample(text, "batchserve_requests_total", status="200") == 2
    assert sample(text, "batchserve_batch_size_count") == 2  # [0] alone, then [1, 2, 3]


async def test_deadline_gives_504_and_the_item_is_not_computed() -> None:
    handler = GatedHandler()
    with live_server(make_settings(), handler) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            first = asyncio.create_task(client.post("/predict", json={"instances": [1]}))
            await wait_until(handler.entered.is_set, "device busy")
            r = await client.post("/predict", json={"instances": [7]},
                                  headers={"X-Request-Timeout": "0.1"})
            assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
            handler.gate.set()
            assert (await first).status_code == 200
            assert (await client.post("/predict", json={"instances": [8]})).status_code == 200
    assert handler.seen == [1.0, 8.0]


async def test_bad_inputs_over_the_wire() -> None:
    with live_server(make_settings(max_body_bytes=10_000, max_instances=4)) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            r = await client.post("/predict", content=b"{bad")
            assert r.status_code == 422 and "not valid JSON" in r.json()["error"]["message"]
            r = await client.post("/predict", json={"instances": [[1, 2]]})
            assert r.status_code == 422
            assert r.json()["error"]["message"] == "instances[0]: expected shape [4], got [2]"
            r = await client.post("/predict", content=b"x" * 20_000)
            assert r.status_code == 413 and "10000 bytes" in r.json()["error"]["message"]

            async def chunks():  # no Content-Length: the limit applies while streaming
                for _ in range(100):
                    yield b"[" * 1000

            r = await client.post("/predict", content=chunks())
            assert r.status_code == 413


async def test_failing_batch_then_success() -> None:
    with live_server(make_settings(), FailingHandler()) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            r = await client.post("/predict", json={"instances": [-1]})
            assert r.status_code == 500 and r.json()["error"]["type"] == "model_error"
            r = await client.post("/predict", json={"instances": [2]})
            assert r.status_code == 200 and r.json() == {"predictions": [4.0]}


async def test_disconnected_client_items_are_not_computed() -> None:
    handler = GatedHandler()
    with live_server(make_settings(), handler) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            first = asyncio.create_task(client.post("/predict", json={"instances": [1]}))
            await wait_until(handler.entered.is_set, "device busy")
            host, port = srv.url.removeprefix("http://").split(":")
            body = b'{"instances": [5]}'
            with socket.create_connection((host, int(port))) as raw:
                raw.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await wait_until(lambda: queued(srv) == 1, "queued")
            # the socket is closed: the server notices and drops the queued item
            service = srv.app.state.service

            def disconnected() -> bool:
                return sample(service.metrics.registry, "batchserve_rejected_total",
                              reason="disconnected") == 1

            await wait_until(disconnected, "disconnect noticed")
            handler.gate.set()
            assert (await first).status_code == 200
            assert (await client.post("/predict", json={"instances": [6]})).status_code == 200
    assert handler.seen == [1.0, 6.0]
