"""ModelStreamInfer driven by the stock tritonclient.grpc (its sync ``start_stream`` and
``async_stream_infer``, its asyncio ``stream_infer``) and by gRPC's own stub."""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as triton_aio

from tests.conftest import LiveServer, live_server, make_settings, sample
from tests.grpc_clients import client_for, expected, one_input

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    # The queue holds every row of the 300 requests sent at once below: none is refused.
    with live_server(make_settings(max_instances=8, api_key="k", queue_capacity=1024),
                     grpc=True) as srv:
        yield srv


AUTH = {"authorization": "Bearer k"}
Answers = queue.Queue[tuple[Any, Any]]


def streamed(srv: LiveServer, requests: list[tuple[str, np.ndarray, str]],
             headers: dict[str, str] | None = None) -> list[tuple[Any, Any]]:
    """Each (model, rows, id) sent on one stream; the (result, error) pairs the callback got."""
    client = client_for(srv)
    got: Answers = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)),
                        headers={**AUTH, **(headers or {})})
    for model, x, rid in requests:
        client.async_stream_infer(model, [one_input(x)], request_id=rid)
    client.stop_stream()  # waits for every answer
    return [got.get_nowait() for _ in range(got.qsize())]


def test_answers_come_in_order_and_a_mistake_fails_only_its_request(server: LiveServer
                                                                    ) -> None:
    registry = server.app.state.service.metrics.registry
    before = {status: sample(registry, "batchserve_requests_total", protocol="grpc",
                             status=status) for status in ("200", "400", "404")}
    rng = np.random.default_rng(0)
    rows = [rng.random((k, 4), dtype=np.float32) for k in (1, 3, 2, 1)]
    answers = streamed(server, [
        ("linear", rows[0], "a"), ("linear", rows[1], "b"),
        ("linear", np.ones((1, 3), np.float32), "wrong shape"),
        ("nosuch", rows[0], "unknown"), ("linear", rows[2], "c"), ("linear", rows[3], "d")])
    assert len(answers) == 6
    for (result, error), x, rid in zip([answers[i] for i in (0, 1, 4, 5)], rows, "abcd",
                                       strict=True):
        assert error is None and result.get_response().id == rid
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(x), rtol=1e-6)
    assert answers[2][0] is None and "expected shape [4], got [3]" in answers[2][1].message()
    assert answers[3][0] is None and "unknown model 'nosuch'" in answers[3][1].message()
    after = {status: sample(registry, "batchserve_requests_total", protocol="grpc",
                            status=status) for status in ("200", "400", "404")}
    assert {s: after[s] - before[s] for s in after} == {"200": 4, "400": 1, "404": 1}


def test_each_request_needs_the_api_key(server: LiveServer) -> None:
    client = client_for(server)
    got: Answers = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("linear", [one_input(np.ones((1, 4), np.float32))])
    client.stop_stream()
    result, error = got.get_nowait()
    assert result is None and error.message() == "missing or invalid bearer token"


def test_triton_grpc_error_ends_the_stream_at_its_first_error(server: LiveServer) -> None:
    """tritonclient's way to have the stream's status say what failed: the first error ends
    it, and the stream takes no more requests."""
    answers = streamed(server, [("linear", np.ones((1, 3), np.float32), "wrong"),
                                ("linear", np.ones((1, 4), np.float32), "after")],
                       headers={"triton_grpc_error": "true"})
    assert [result for result, _ in answers] == [None]
    assert "StatusCode.INVALID_ARGUMENT" in str(answers[0][1].status())


async def aio_streamed(srv: LiveServer, xs: list[np.ndarray]) -> list[tuple[Any, Any]]:
    """Each of ``xs`` sent on one stream by tritonclient's asyncio client without waiting
    (request id: its index); the (result, error) pairs it gave."""
    assert srv.grpc_url is not None
    client = triton_aio.InferenceServerClient(srv.grpc_url)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for k, x in enumerate(xs):
            yield {"model_name": "linear", "inputs": [one_input(x)], "request_id": str(k)}

    got = [(result, error) async for result, error in client.stream_infer(requests(),
                                                                         headers=AUTH)]
    await client.close()
    return got


@pytest.mark.asyncio
async def test_the_asyncio_client_streams(server: LiveServer) -> None:
    xs = [np.full((2, 4), k, np.float32) for k in range(3)]
    got = await aio_streamed(server, xs)
    assert [result.get_response().id for result, _ in got] == ["0", "1", "2"]
    for (result, _), x in zip(got, xs, strict=True):
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(x), rtol=1e-6)


@pytest.mark.asyncio
async def test_many_requests_in_flight_on_one_stream_each_get_their_own_answer(
        server: LiveServer) -> None:
    """300 requests of 1-3 rows sent without waiting (they batch together, and finish out of
    order): each answer is its own request's, and they come in the order sent."""
    rng = np.random.default_rng(2)
    sent = [rng.random((1 + k % 3, 4), dtype=np.float32) for k in range(300)]
    got = await aio_streamed(server, sent)
    assert [error for _, error in got] == [None] * 300
    assert [result.get_response().id for result, _ in got] == [str(k) for k in range(300)]
    for (result, _), x in zip(got, sent, strict=True):
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(x), rtol=1e-5)
