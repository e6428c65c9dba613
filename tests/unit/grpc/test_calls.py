"""app/grpc/calls.py: what every gRPC call shares."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from app.errors import DeadlineExceeded
from app.grpc.calls import Calls

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
