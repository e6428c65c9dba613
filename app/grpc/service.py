"""``inference.GRPCInferenceService``: the Open Inference Protocol over gRPC, with the same rules
as the v2 HTTP routes.

ModelInfer runs in this process like an HTTP infer (app/api/inference.py: auth, deadline, parse,
admit whole or refuse at once, decode, queue, await); the other calls are the v2 HTTP requests
they stand for (app/grpc/control.py). Every call is logged with its request id (the
``x-request-id`` metadata, else a new one, sent back in the trailing metadata). A client mistake
is ``INVALID_ARGUMENT`` with the HTTP route's message, a refusal ``UNAVAILABLE`` at once with
its reason (``retry-after`` in the trailing metadata), and a call the client cancels drops its
queued items as a closed HTTP connection does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeAlias, TypeVar
from urllib.parse import quote

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from app.api.access import RequestIds
from app.api.auth import check_auth
from app.api.error_responses import V2
from app.api.inference import CLIENT_CLOSED, Serving, submit
from app.api.v2.codec import output_tensors
from app.errors import DeadlineExceeded, InvalidInput, NotFound, ServeError
from app.grpc import inference_pb2 as pb
from app.grpc.control import Control
from app.grpc.tensors import encode_infer, parameter_value, parse_infer
from app.logs import request_id

log = logging.getLogger("batchserve.access")
errors_log = logging.getLogger("batchserve")

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]  # as inference.proto declares it

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

    def rpc(self, method: Method[Reply]) -> Handler[Reply]:
        name = method.__name__

        @functools.wraps(method)
        async def call(servicer: Any, request: Any, context: Context) -> Reply:
            metadata = metadata_of(context)
            rid = self.ids.take(metadata.get("x-request-id"))
            token = request_id.set(rid)
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            trailers: list[tuple[str, str]] = [("x-request-id", rid)]
            try:
                if type(request) is Malformed:
                    raise InvalidInput(request.message)
                return await method(servicer, request, context, metadata)
            except ServeError as exc:
                code = code_of(exc.status)
                if exc.retry_after_s is not None:
                    trailers.append(("retry-after", str(exc.retry_after_s)))
                context.set_trailing_metadata(trailers)
                await context.abort(code, exc.message)
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception:  # the traceback to the log, nothing of it to the client
                errors_log.exception("gRPC %s failed", name)
                code = grpc.StatusCode.INTERNAL
                context.set_trailing_metadata(trailers)
                await context.abort(code, "internal server error")
            finally:
                if code is grpc.StatusCode.OK:
                    context.set_trailing_metadata(trailers)
                elapsed_ms = (time.perf_counter() - started) * 1000
                log.info('%s "gRPC %s" %s %.1fms', context.peer(), name, code.name, elapsed_ms,
                         extra={"method": "gRPC", "path": name, "status": code.name,
                                "duration_ms": round(elapsed_ms, 3), "client": context.peer()})
                request_id.reset(token)
            raise AssertionError("unreachable: abort raises")

        return call


calls = Calls()


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


def method_table(servicer: Any, service: ServiceDescriptor = SERVICE,
                 messages: ModuleType = pb) -> grpc.GenericRpcHandler:
    """``service`` as gRPC serves it: each method it declares, answered by the servicer's method
    of that name, its messages (de)serialized by their generated classes in ``messages``; a
    request that does not parse reaches the method as ``Malformed``."""
    handlers = {}
    for method in service.methods:
        kind = (grpc.unary_stream_rpc_method_handler if method.server_streaming
                else grpc.unary_unary_rpc_method_handler)
        handlers[method.name] = kind(
            getattr(servicer, method.name),
            request_deserializer=_parser(getattr(messages, method.input_type.name)),
            response_serializer=getattr(messages, method.output_type.name).SerializeToString)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


class InferenceServicer:
    def __init__(self, service: Serving, control: Control) -> None:
        self.service = service
        self.control = control

    @calls.rpc
    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: Context, metadata: Metadata) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @calls.rpc
    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: Context, metadata: Metadata) -> pb.ServerReadyResponse:
        status, _ = await self.control.get("/v2/health/ready", metadata)
        return pb.ServerReadyResponse(ready=status == 200)

    @calls.rpc
    async def ModelReady(self, request: pb.ModelReadyRequest,
                         context: Context, metadata: Metadata) -> pb.ModelReadyResponse:
        path = _model_path(request.name, request.version) + "/ready"
        try:
            status, _ = await self.control.get(path, metadata)
        except ServeError as exc:  # a model the server does not have is not ready
            if exc.status != 404:
                raise
            status = exc.status
        return pb.ModelReadyResponse(ready=status == 200)

    @calls.rpc
    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: Context, metadata: Metadata) -> pb.ServerMetadataResponse:
        _, body = await self.control.get("/v2", metadata)
        return pb.ServerMetadataResponse(name=body["name"], version=body["version"],
                                         extensions=body["extensions"])

    @calls.rpc
    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: Context, metadata: Metadata) -> pb.ModelMetadataResponse:
        _, body = await self.control.get(_model_path(request.name, request.version),
                                         metadata)
        response = pb.ModelMetadataResponse(name=body["name"], versions=body["versions"],
                                            platform=body["platform"])
        for kind in ("inputs", "outputs"):
            for tensor in body[kind]:
                getattr(response, kind).add(name=tensor["name"], datatype=tensor["datatype"],
                                            shape=tensor["shape"])
        return response

    @calls.rpc
    async def ModelConfig(self, request: pb.ModelConfigRequest,
                          context: Context, metadata: Metadata) -> pb.ModelConfigResponse:
        _, body = await self.control.get(_model_path(request.name, request.version) + "/config",
                                         metadata)
        return pb.ModelConfigResponse(config=json_format.ParseDict(body, pb.ModelConfig()))

    @calls.rpc
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: Context, metadata: Metadata) -> pb.RepositoryIndexResponse:
        models = await self.control.post("/v2/repository/index", metadata,
                                         {"ready": request.ready})
        response = pb.RepositoryIndexResponse()
        for entry in models:
            assert isinstance(entry, dict)
            response.models.add(**{key: str(entry.get(key, "")) for key in
                                   ("name", "version", "state", "reason")})
        return response

    @calls.rpc
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context, metadata: Metadata,
    ) -> pb.RepositoryModelLoadResponse:
        params = {key: parameter_value(value) for key, value in request.parameters.items()}
        if isinstance(params.get("config"), bytes):
            raise InvalidInput("'config' must be a string of JSON")
        await self.control.post(f"/v2/repository/models/{_segment(request.model_name)}/load",
                                metadata, {"parameters": params}, changes_models=True)
        return pb.RepositoryModelLoadResponse()

    @calls.rpc
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context, metadata: Metadata,
    ) -> pb.RepositoryModelUnloadResponse:
        params = {key: parameter_value(value) for key, value in request.parameters.items()}
        await self.control.post(f"/v2/repository/models/{_segment(request.model_name)}/unload",
                                metadata, {"parameters": params}, changes_models=True)
        return pb.RepositoryModelUnloadResponse()

    @calls.rpc
    async def ModelInfer(self, request: pb.ModelInferRequest,
                         context: Context, metadata: Metadata) -> pb.ModelInferResponse:
        return await infer(self.service, request, context, metadata)


async def infer(service: Serving, request: pb.ModelInferRequest,
                context: Context, metadata: Metadata) -> pb.ModelInferResponse:
    """One ModelInfer: the HTTP infer's steps and metrics (``protocol="grpc"``), with the gRPC
    deadline as one more bound on the request's."""
    arrived = time.monotonic()
    try:
        model = service.repository.get(request.model_name, request.model_version or None)
        missing = None
    except NotFound as exc:  # answered after the auth check, so unknown names leak nothing
        model, missing = None, exc
    metrics = model.metrics if model is not None else service.unknown
    status = 500
    tracing = service.tracing
    span = None
    if tracing is not None:
        span = tracing.start(f"{SERVICE.full_name}/ModelInfer", metadata, arrived,
                             {"batchserve.model": model.name if model is not None else "",
                              "rpc.system": "grpc"})
    remaining = context.time_remaining()
    try:
        check_auth(metadata.get("authorization"), service.settings.api_key)
        if model is None:
            assert missing is not None
            raise missing
        deadline = arrived + model.settings.request_timeout_s
        if remaining is not None:
            deadline = min(deadline, arrived + remaining)
        parsed = parse_infer(request, model.settings.max_instances, model.input_spec,
                             model.output_specs)
        if parsed.timeout_us:
            deadline = min(deadline, arrived + parsed.timeout_us / 1e6)
        pending = await submit(model, parsed.rows, model.level_of(parsed.priority), deadline,
                               span)
        results = await model.result(pending)
        response = encode_infer(model.name, model.version, parsed, output_tensors(results))
        status = 200
        return response
    except asyncio.CancelledError:  # the client cancelled, or its deadline passed
        late = remaining is not None and time.monotonic() >= arrived + remaining
        status = DeadlineExceeded.status if late else CLIENT_CLOSED
        metrics.rejected(DeadlineExceeded.type if late else "disconnected")
        raise
    except ServeError as exc:
        status = V2.status_of(exc.status)
        if status != 500:
            metrics.rejected(exc.type)
        raise
    finally:
        ended = time.monotonic()
        metrics.answered(status, ended - arrived, "grpc")
        if span is not None:
            assert tracing is not None
            tracing.end(span, status, ended)


def _segment(name: str) -> str:
    """A model name (or version) as one URL path segment: no name holds a '/' (the app would
    read an encoded one as a separator)."""
    if not name or name in (".", "..") or "/" in name:
        raise InvalidInput(f"'{name}' is not a model name")
    return quote(name, safe="")


def _model_path(name: str, version: str) -> str:
    path = f"/v2/models/{_segment(name)}"
    return f"{path}/versions/{_segment(version)}" if version else path
