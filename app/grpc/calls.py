"""What every gRPC call of this server shares (app/grpc/service.py, app/grpc/healthcheck.py):
its request id (the ``x-request-id`` metadata, else a new one, sent back in the trailing
metadata), its access log line, errors as gRPC statuses (a ServeError as the status its HTTP
answer stands for; anything else ``INTERNAL``, its traceback to the log only), the method table
that (de)serializes each call's messages, answering bytes that are not the call's message
``INVALID_ARGUMENT``, and the bound on calls in flight (``CallLimit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn, TypeAlias, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from app.api.access import RequestIds, log_access
from app.errors import InvalidInput, ServeError, bounded
from app.facade import Refusals
from app.grpc import inference_pb2 as pb
from app.logs import request_id

errors_log = logging.getLogger("batchserve")

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]  # as inference.proto declares it


def retry_trailers(seconds: int) -> list[tuple[str, str]]:
    """When a refused call may come again, as HTTP's Retry-After says it (``retry-after``),
    and as gRPC's own retries read it (``grpc-retry-pushback-ms``, gRFC A6): a client whose
    channel retries UNAVAILABLE (KServe's ``InferenceGRPCClient`` does by default) waits
    that long before its next attempt, not its backoff's tenth of a second."""
    return [("retry-after", str(seconds)), ("grpc-retry-pushback-ms", str(seconds * 1000))]


_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
          413: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT,
          499: grpc.StatusCode.CANCELLED, 503: grpc.StatusCode.UNAVAILABLE,
          504: grpc.StatusCode.DEADLINE_EXCEEDED}

Reply = TypeVar("Reply")
Metadata: TypeAlias = dict[str, str]
Context: TypeAlias = grpc.aio.ServicerContext
# A servicer method as written here (it gets the call's metadata, read once) and as gRPC calls it.
Method = Callable[[Any, Any, Context, Metadata], Awaitable[Reply]]
Handler = Callable[[Any, Any, Context], Awaitable[Reply]]


def code_of(status: int) -> grpc.StatusCode:
    """The gRPC status of an error the HTTP routes answer with ``status``."""
    return _CODES.get(status, grpc.StatusCode.INTERNAL)


def metadata_of(context: Context) -> Metadata:
    return {key: value for key, value in context.invocation_metadata() or ()
            if isinstance(value, str)}


class Calls:
    """What every call shares: its request id, the access log line, and errors as statuses."""

    def __init__(self) -> None:
        self.ids = RequestIds()

    @contextlib.contextmanager
    def logged(self, name: str, peer: str, given: str | None) -> Iterator[Outcome]:
        """A call's (or a streamed request's) request id (``given`` if sane), set while it
        runs, and its access line with the outcome's code once it ends."""
        outcome = Outcome(self.ids.take(given))
        token = request_id.set(outcome.rid)
        started = time.perf_counter()
        try:
            yield outcome
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            log_access(logging.INFO, peer, "gRPC", name, outcome.code.name, elapsed_ms)
            request_id.reset(token)

    def rpc(self, method: Method[Reply]) -> Handler[Reply]:
        name = method.__name__

        @functools.wraps(method)
        async def call(servicer: Any, request: Any, context: Context) -> Reply:
            metadata = metadata_of(context)
            with self.logged(name, context.peer(), metadata.get("x-request-id")) as outcome:
                trailers: list[tuple[str, str]] = [("x-request-id", outcome.rid)]
                try:
                    if type(request) is Malformed:
                        raise InvalidInput(request.message)
                    return await method(servicer, request, context, metadata)
                except asyncio.CancelledError:
                    outcome.code = grpc.StatusCode.CANCELLED
                    raise
                except Exception as exc:
                    outcome.code, message = failure(exc, name)
                    if isinstance(exc, ServeError) and exc.retry_after_s is not None:
                        trailers += retry_trailers(exc.retry_after_s)
                    context.set_trailing_metadata(trailers)
                    await abort(context, outcome.code, message)
                finally:
                    if outcome.code is grpc.StatusCode.OK:
                        context.set_trailing_metadata(trailers)
            raise AssertionError("unreachable: abort raises")

        return call


@dataclass
class Outcome:
    """What ``Calls.logged`` logs: the request id, and the status the call ended with."""

    rid: str
    code: grpc.StatusCode = grpc.StatusCode.OK


calls = Calls()


def failure(exc: Exception, name: str) -> tuple[grpc.StatusCode, str]:
    """The status and message of a call (or a streamed request) whose method raised ``exc``: a
    ServeError's as its HTTP answer stands for; anything else INTERNAL, its traceback to the
    log only."""
    if isinstance(exc, ServeError):
        return code_of(exc.status), exc.message
    errors_log.error("gRPC %s failed", name, exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal server error"


async def abort(context: Context, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with ``code`` and ``message`` (``bounded``: gRPC sends it in a header). A
    call that gRPC has ended meanwhile (its deadline passed, or its client left, as the error
    came) can take no status: it ends as a cancelled call does, quietly, where gRPC would log
    the failed send with a traceback."""
    try:
        await context.abort(code, bounded(message))
    except grpc.aio.InternalError as exc:
        raise asyncio.CancelledError from exc
    raise AssertionError("unreachable: abort raises")


@dataclass(frozen=True)
class Malformed:
    """A request whose bytes do not parse as its message: ``Calls.rpc`` answers it
    INVALID_ARGUMENT. (A deserializer that raises makes gRPC answer UNKNOWN with the Python
    exception's name, and log a traceback.)"""

    message: str


def _parser(message: type[Message]) -> Callable[[bytes], Message | Malformed]:
    def parse(data: bytes) -> Message | Malformed:
        try:
            return message.FromString(data)
        except DecodeError:
            return Malformed(f"the request is not a valid {message.DESCRIPTOR.full_name} message")

    return parse


class CallLimit:
    """At most ``most`` calls in flight (``max_connections``, as HTTP bounds connections): one
    more is refused ``RESOURCE_EXHAUSTED`` at once. A call's place is free once its method has
    returned, before its answer is sent, so a client that calls again as soon as it is answered
    finds it free. (gRPC's own ``maximum_concurrent_rpcs`` frees it a few loop passes after the
    answer has gone: a closed loop of ``most`` clients was now and then refused.)"""

    def __init__(self, most: int, refused: Refusals | None = None) -> None:
        """``refused`` counts each call refused (as HTTP would have answered it, 503)."""
        self.most = most
        self.active = 0
        self._refused = refused

    @property
    def refusal(self) -> str:
        return f"{self.most} calls are in flight, as many as max_connections allows"

    def take(self) -> bool:
        """A place for one call (or one request of a stream) if one is free; False, the refusal
        counted, if not."""
        if self.active >= self.most:
            if self._refused is not None:
                self._refused(503, "connections", 0.0)
            return False
        self.active += 1
        return True

    def free(self) -> None:
        self.active -= 1

    async def _enter(self, context: Context) -> None:
        if not self.take():  # when to come again, as HTTP's 503 past max_connections says
            context.set_trailing_metadata(retry_trailers(1))
            await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, self.refusal)

    def unary(self, handler: Callable[[Any, Context], Awaitable[Reply]]
              ) -> Callable[[Any, Context], Awaitable[Reply]]:
        async def limited(request: Any, context: Context) -> Reply:
            await self._enter(context)
            try:
                return await handler(request, context)
            finally:
                self.free()

        return limited

    def streaming(self, handler: Callable[[Any, Context], AsyncIterator[Reply]]
                  ) -> Callable[[Any, Context], AsyncIterator[Reply]]:
        async def limited(request: Any, context: Context) -> AsyncIterator[Reply]:
            await self._enter(context)
            try:
                async for reply in handler(request, context):
                    yield reply
            finally:
                self.free()

        return limited


def method_table(servicer: Any, limit: CallLimit, service: ServiceDescriptor = SERVICE,
                 messages: ModuleType = pb) -> dict[str, grpc.RpcMethodHandler]:
    """``service``'s methods as gRPC serves them (``add_registered_method_handlers``): each
    method it declares, answered by the servicer's method of that name, its calls counted
    against ``limit`` (a stream of requests counts each one itself), its messages
    (de)serialized by their generated classes in ``messages``; a request that does not parse
    reaches the method as ``Malformed``."""
    handlers = {}
    for method in service.methods:
        handler = getattr(servicer, method.name)
        if method.client_streaming:  # app/grpc/streaming.py
            kind = grpc.stream_stream_rpc_method_handler
        elif method.server_streaming:
            kind, handler = grpc.unary_stream_rpc_method_handler, limit.streaming(handler)
        else:
            kind, handler = grpc.unary_unary_rpc_method_handler, limit.unary(handler)
        handlers[method.name] = kind(
            handler,
            request_deserializer=_parser(getattr(messages, method.input_type.name)),
            response_serializer=getattr(messages, method.output_type.name).SerializeToString)
    return handlers
