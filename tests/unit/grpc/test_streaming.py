"""app/grpc/streaming.py: ModelStreamInfer's requests answered in their order, each on its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from app.errors import InvalidInput
from app.grpc import inference_pb2 as pb
from app.grpc.calls import CallLimit, Malformed
from app.grpc.streaming import answers

pytestmark = pytest.mark.asyncio


class Aborted(Exception):
    pass


class StreamContext:
    def __init__(self, metadata: dict[str, str] | None = None) -> None:
        self.metadata = metadata or {}

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return list(self.metadata.items())

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


class Requests:
    """``ids`` as requests, counting how many the server has read."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.read = 0

    def __aiter__(self) -> Requests:
        return self

    async def __anext__(self) -> Any:
        if self.read == len(self.ids):
            raise StopAsyncIteration
        self.read += 1
        given = self.ids[self.read - 1]
        return Malformed("not a message") if given == "malformed" else \
            pb.ModelInferRequest(model_name="m", id=given)


class Gates:
    """An infer whose answer to each id waits for that id's gate; "bad" is a client mistake."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.cancelled: list[str] = []

    def open(self, *ids: str) -> None:
        for i in ids:
            self.gate(i).set()

    def gate(self, i: str) -> asyncio.Event:
        return self.gates.setdefault(i, asyncio.Event())

    async def __call__(self, request: pb.ModelInferRequest, metadata: Any
                       ) -> pb.ModelInferResponse:
        try:
            await self.gate(request.id).wait()
        except asyncio.CancelledError:
            self.cancelled.append(request.id)
            raise
        if request.id.startswith("bad"):
            raise InvalidInput(f"request {request.id} is wrong")
        return pb.ModelInferResponse(model_name="m", id=request.id)


def ids_of(stream: list[pb.ModelStreamInferResponse]) -> list[tuple[str, str]]:
    return [(a.infer_response.id, a.error_message) for a in stream]


async def collect(stream: AsyncIterator[pb.ModelStreamInferResponse]
                  ) -> list[pb.ModelStreamInferResponse]:
    return [a async for a in stream]


async def test_answers_come_in_the_order_the_requests_came_and_errors_keep_the_stream() -> None:
    """The second request is answered first, but its answer waits for the first's; a client
    mistake and bytes that are no message are answers with ``error_message`` (the id kept), and
    the stream goes on."""
    infer = Gates()
    stream = asyncio.ensure_future(collect(answers(
        Requests(["1", "2", "bad", "malformed", "4"]), StreamContext(), infer, CallLimit(10))))
    infer.open("2", "bad", "4")
    await asyncio.sleep(0.01)
    assert not stream.done()
    infer.open("1")
    assert ids_of(await stream) == [
        ("1", ""), ("2", ""), ("bad", "request bad is wrong"), ("", "not a message"), ("4", "")]


async def test_a_client_that_does_not_take_its_answers_is_read_no_further() -> None:
    """At most ``max_connections`` requests of a stream wait for their answer to be sent."""
    infer = Gates()
    infer.open(*map(str, range(10)))
    requests = Requests([str(i) for i in range(10)])
    stream = answers(requests, StreamContext(), infer, CallLimit(3))
    first = await anext(stream)
    await asyncio.sleep(0.01)
    assert first.infer_response.id == "0" and requests.read == 3
    assert ids_of([a async for a in stream]) == [(str(i), "") for i in range(1, 10)]


async def test_requests_past_the_calls_in_flight_are_refused_at_once() -> None:
    """Each request is a call in flight for ``max_connections``: one past it is answered with
    the refusal, while the others are still running, and counted as refused."""
    infer = Gates()
    refused: list[tuple[int, str]] = []
    limit = CallLimit(2, lambda status, reason, wait: refused.append((status, reason)))
    limit.active = 1  # one ModelInfer call elsewhere
    stream = answers(Requests(["1", "2"]), StreamContext(), infer, limit)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.01)
    assert limit.active == 2 and refused == [(503, "connections")]
    infer.open("1")
    assert ids_of([await pending, *[a async for a in stream]]) == [
        ("1", ""), ("2", "2 calls are in flight, as many as max_connections allows")]
    assert limit.active == 1


async def test_triton_grpc_error_ends_the_stream_at_the_first_error_with_its_status() -> None:
    infer = Gates()
    infer.open("1", "bad", "3")
    stream = answers(Requests(["1", "bad", "3"]), StreamContext({"triton_grpc_error": "true"}),
                     infer, CallLimit(10))
    assert (await anext(stream)).infer_response.id == "1"
    with pytest.raises(Aborted) as ended:
        await anext(stream)
    assert ended.value.args == (grpc.StatusCode.INVALID_ARGUMENT, "request bad is wrong")


async def test_a_stream_that_ends_under_its_requests_cancels_them() -> None:
    """A client that leaves: the requests still running are cancelled (their queued items
    dropped, as a cancelled ModelInfer's are), and their places freed."""
    infer = Gates()
    limit = CallLimit(10)
    stream = answers(Requests(["1", "2", "3"]), StreamContext(), infer, limit)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.01)
    assert limit.active == 3
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    await stream.aclose()
    await asyncio.sleep(0.01)
    assert sorted(infer.cancelled) == ["1", "2", "3"] and limit.active == 0
