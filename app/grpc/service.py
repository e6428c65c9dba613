"""``inference.GRPCInferenceService``: the Open Inference Protocol over gRPC, with the same rules
as the v2 HTTP routes.

ModelInfer (and each request of ModelStreamInfer, app/grpc/streaming.py) runs in this process
like an HTTP infer (app/api/inference.py: auth, deadline, parse, admit whole or refuse at once,
decode, queue, await); the other calls are the v2 HTTP requests they stand for
(app/grpc/control.py). Every call goes through app/grpc/calls.py (request id, access log,
errors as statuses, the method table). A client mistake is ``INVALID_ARGUMENT``
with the HTTP route's message, a refusal ``UNAVAILABLE`` at once with its reason
(``retry-after`` and ``grpc-retry-pushback-ms`` in the trailing metadata), and a call the
client cancels drops its queued items as a closed HTTP connection does.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from google.protobuf import json_format

from app.api.auth import check_auth
from app.api.body import CLIENT_CLOSED
from app.api.error_responses import V2
from app.api.inference import Serving, looked_up, submit
from app.errors import DeadlineExceeded, InvalidInput, ServeError
from app.grpc import inference_pb2 as pb
from app.grpc import streaming
from app.grpc.calls import SERVICE, CallLimit, Context, Metadata, calls
from app.grpc.control import Control
from app.grpc.tensors import encode_infer, parameter_value, parse_infer
from app.models.signature import output_tensors

RepositoryRequest = pb.RepositoryModelLoadRequest | pb.RepositoryModelUnloadRequest


class InferenceServicer:
    def __init__(self, service: Serving, control: Control, limit: CallLimit) -> None:
        """``limit``: the calls in flight, which each request of a stream counts in."""
        self.service = service
        self.control = control
        self.limit = limit

    @calls.rpc
    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: Context, metadata: Metadata) -> pb.ServerLiveResponse:
        status, _ = await self.control.get("/v2/health/live", metadata)
        return pb.ServerLiveResponse(live=status == 200)

    @calls.rpc
    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: Context, metadata: Metadata) -> pb.ServerReadyResponse:
        status, _ = await self.control.get("/v2/health/ready", metadata)
        return pb.ServerReadyResponse(ready=status == 200)

    @calls.rpc
    async def ModelReady(self, request: pb.ModelReadyRequest,
                         context: Context, metadata: Metadata) -> pb.ModelReadyResponse:
        try:
            path = _model_path(request.name, request.version) + "/ready"
        except InvalidInput:  # a name no model has (``_segment``): not ready, as over HTTP
            return pb.ModelReadyResponse(ready=False)
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
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context,
                              metadata: Metadata) -> pb.ModelStatisticsResponse:
        path = _model_path(request.name, request.version) + "/stats" if request.name \
            else "/v2/models/stats"
        _, body = await self.control.get(path, metadata)
        response = pb.ModelStatisticsResponse()
        json_format.ParseDict(body, response)
        return response

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
        await self._repository("load", request, metadata)
        return pb.RepositoryModelLoadResponse()

    @calls.rpc
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context, metadata: Metadata,
    ) -> pb.RepositoryModelUnloadResponse:
        await self._repository("unload", request, metadata)
        return pb.RepositoryModelUnloadResponse()

    async def _repository(self, action: str, request: RepositoryRequest,
                          metadata: Metadata) -> None:
        """``POST /v2/repository/models/NAME/<action>`` with the call's parameters."""
        await self.control.post(f"/v2/repository/models/{_segment(request.model_name)}/{action}",
                                metadata, {"parameters": _json_parameters(request)},
                                changes_models=True)

    @calls.rpc
    async def ModelInfer(self, request: pb.ModelInferRequest,
                         context: Context, metadata: Metadata) -> pb.ModelInferResponse:
        return await infer(self.service, request, context, metadata)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Context
                               ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """ModelInfer's requests on one stream, answered in their order (app/grpc/streaming.py)."""
        async def one(request: pb.ModelInferRequest, metadata: Metadata) -> pb.ModelInferResponse:
            return await infer(self.service, request, context, metadata, streaming.NAME)

        async for answer in streaming.answers(requests, context, one, self.limit):
            yield answer


def _json_parameters(request: RepositoryRequest) -> dict[str, Any]:
    """A load's or unload's parameters as the HTTP route takes them: bytes (tritonclient sends
    ``file:`` contents so) as base64 text, as Triton's HTTP protocol carries them."""
    params = {key: parameter_value(value) for key, value in request.parameters.items()}
    if isinstance(params.get("config"), bytes):
        raise InvalidInput("'config' must be a string of JSON")
    return {key: base64.b64encode(value).decode() if isinstance(value, bytes) else value
            for key, value in params.items()}


async def infer(service: Serving, request: pb.ModelInferRequest, context: Context,
                metadata: Metadata, method: str = "ModelInfer") -> pb.ModelInferResponse:
    """One ModelInfer (or one request of ``method``'s stream): the HTTP infer's steps and
    metrics (``protocol="grpc"``), with the gRPC deadline as one more bound on the request's."""
    arrived = time.monotonic()
    model, missing, metrics = looked_up(service, request.model_name,
                                        request.model_version or None)
    status = 500
    tracing = service.tracing
    span = None
    if tracing is not None:
        span = tracing.start(f"{SERVICE.full_name}/{method}", metadata, arrived,
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
            metrics.rejected(exc.reason)
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
