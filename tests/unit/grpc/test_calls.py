"""app/grpc/calls.py: what every gRPC call shares."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from app.errors import DeadlineExceeded
from app.grpc.calls import CallLimit, Calls

pytestmark = pytest.mark.asyncio


class EndedContext:
    """A call that gRPC has already ended (its deadline passed): its status cannot be sent."""

    def __init__(self) -> None:
        self.aborted: list[grpc.StatusCode] = []

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return []

    def set_trailing_metadata(self, trailers: Any) -> None:
        pass

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.append(code)
        raise grpc.aio.InternalError('Failed "execute_batch"')  # as cygrpc's ExecuteBatchError


async def test_an_error_for_a_call_grpc_has_ended_ends_it_as_cancelled_and_logs_its_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Our deadline and gRPC's pass together: the abort gRPC cannot send ends the call quietly
    (gRPC logs a traceback for anything else its handler raises), and the access line says
    DEADLINE_EXCEEDED."""

    async def late(servicer: Any, request: Any, context: Any, metadata: Any) -> None:
        raise DeadlineExceeded("the request's deadline passed before it was answered")

    context = EndedContext()
    with caplog.at_level(logging.INFO, logger="batchserve.access"), \
            pytest.raises(asyncio.CancelledError):
        await Calls().rpc(late)(None, object(), context)  # type: ignore[arg-type]
    assert context.aborted == [grpc.StatusCode.DEADLINE_EXCEEDED]
    assert [(r.path, r.status) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("late", "DEADLINE_EXCEEDED")]


class Aborted(Exception):
    pass


class LiveContext:
    def __init__(self) -> None:
        self.trailers: list[tuple[str, str]] = []

    def set_trailing_metadata(self, trailers: list[tuple[str, str]]) -> None:
        self.trailers = trailers

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


async def test_a_call_s_place_is_free_once_its_method_returns_and_one_more_is_refused() -> None:
    """``max_connections`` calls run; one more is refused RESOURCE_EXHAUSTED; a place is free
    as soon as a method returns (before gRPC sends its answer), and after a method that raised
    or a stream that ended: a client called again at once is taken."""
    gate = asyncio.Event()
    limit = CallLimit(2)

    async def held(request: Any, context: Any) -> str:
        await gate.wait()
        return f"answer {request}"

    async def failing(request: Any, context: Any) -> str:
        raise ValueError(request)

    async def stream(request: Any, context: Any) -> Any:
        yield request

    call, fail = limit.unary(held), limit.unary(failing)
    context = LiveContext()
    running = [asyncio.ensure_future(call(i, context)) for i in (1, 2)]
    await asyncio.sleep(0)
    assert limit.active == 2
    with pytest.raises(Aborted) as refused:
        await call(3, context)
    assert refused.value.args[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert context.trailers == [("retry-after", "1"), ("grpc-retry-pushback-ms", "1000")]
    with pytest.raises(Aborted):
        await anext(limit.streaming(stream)(3, context))
    gate.set()
    assert await asyncio.gather(*running) == ["answer 1", "answer 2"]
    assert limit.active == 0
    assert await call(4, context) == "answer 4"
    with pytest.raises(ValueError):
        await fail(5, context)
    assert [r async for r in limit.streaming(stream)(6, context)] == [6]
    assert limit.active == 0
