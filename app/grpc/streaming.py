"""``ModelStreamInfer``: ModelInfer's requests on one bidirectional stream, served as Triton
serves them for a model that is not decoupled (tritonclient's ``start_stream`` and
``async_stream_infer``, its asyncio ``stream_infer``, ``perf_analyzer --streaming``).

Each request gets one answer, in the order the requests came: its ModelInferResponse, or an
``error_message`` with the request's ``id`` kept in ``infer_response``, so that the client
knows which request failed. An error ends its request, not the stream, unless the call's
metadata says ``triton_grpc_error: true``: then the first error ends the stream with its
status, as Triton does. The stream ends OK once its client has sent all and every answer has
gone.

Each request is one call in flight for ``max_connections`` (CallLimit): one past it is
answered with the refusal at once, as a ModelInfer call past it is refused. At most
``max_connections`` requests of one stream wait for their answer to be sent; past that the
stream is not read until its client takes answers (HTTP/2's flow control then holds the
client), so a client that sends and never reads holds a bounded number of them. Each request
has its own request id (its ``id`` where that is a sane one, else a new one) and its own access
line, and counts in the metrics as a ModelInfer call does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from app.errors import InvalidInput, bounded
from app.grpc import inference_pb2 as pb
from app.grpc.calls import (
    CallLimit,
    Context,
    Malformed,
    Metadata,
    abort,
    calls,
    failure,
    metadata_of,
)

NAME = "ModelStreamInfer"
ENDS_ON_ERROR = "triton_grpc_error"  # metadata: "true" ends the stream at its first error

Infer = Callable[[pb.ModelInferRequest, Metadata], Awaitable[pb.ModelInferResponse]]


@dataclass(frozen=True)
class Answer:
    message: pb.ModelStreamInferResponse
    code: grpc.StatusCode


async def answers(requests: AsyncIterator[Any], context: Context, infer: Infer,
                  limit: CallLimit) -> AsyncIterator[pb.ModelStreamInferResponse]:
    """The answers to ``requests``, in their order, each by ``infer`` (a ModelInfer's steps)."""
    metadata = metadata_of(context)
    ends_on_error = metadata.get(ENDS_ON_ERROR, "").lower() == "true"
    peer = context.peer()
    room = asyncio.Semaphore(limit.most)
    # Each request's answer, in the order they came; then None (all read) or what broke the read.
    order: asyncio.Queue[asyncio.Task[Answer] | Exception | None] = asyncio.Queue()

    async def read() -> None:
        try:
            while True:
                await room.acquire()  # before the read: a place for its answer
                try:
                    request = await anext(requests)
                except StopAsyncIteration:
                    break
                order.put_nowait(asyncio.ensure_future(
                    _answer(request, metadata, infer, limit, peer)))
        except Exception as exc:
            order.put_nowait(exc)
            return
        order.put_nowait(None)

    reader = asyncio.ensure_future(read())
    answering: asyncio.Task[Answer] | None = None
    try:
        while (item := await order.get()) is not None:
            if isinstance(item, Exception):
                await abort(context, *failure(item, NAME))
            answering = item
            answer = await answering
            if ends_on_error and answer.code is not grpc.StatusCode.OK:
                await abort(context, answer.code, answer.message.error_message)
            yield answer.message
            room.release()
    finally:  # the client left, or the stream ended at an error: what is left goes unanswered
        reader.cancel()
        if answering is not None:
            answering.cancel()
        while not order.empty():
            left = order.get_nowait()
            if isinstance(left, asyncio.Task):
                left.cancel()


async def _answer(request: pb.ModelInferRequest | Malformed, metadata: Metadata, infer: Infer,
                  limit: CallLimit, peer: str) -> Answer:
    """One request's answer, as ``Calls.rpc`` would end its call: its id set while it runs (in
    its own task), its access line, its error as the status its HTTP answer stands for."""
    given = request.id if isinstance(request, pb.ModelInferRequest) else ""
    with calls.logged(NAME, peer, given or None) as outcome:
        message = ""
        try:
            if isinstance(request, Malformed):
                raise InvalidInput(request.message)
            if limit.take():
                try:
                    return Answer(pb.ModelStreamInferResponse(
                        infer_response=await infer(request, metadata)), outcome.code)
                finally:
                    limit.free()
            outcome.code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, limit.refusal
        except asyncio.CancelledError:
            outcome.code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            outcome.code, message = failure(exc, NAME)
    return Answer(pb.ModelStreamInferResponse(
        error_message=bounded(message), infer_response=pb.ModelInferResponse(id=given)),
        outcome.code)
