"""KServe's own v2 clients (the ``kserve`` SDK's ``InferenceRESTClient`` and
``InferenceGRPCClient``) against a running server, run as a child process by
tests/integration/test_kserve_client.py: the ``kserve`` package registers the protocol's gRPC
messages in protobuf's default pool, as tritonclient.grpc does, and the second to come fails,
so the two clients cannot share a test process.

    python -m tests.kserve_client HTTP_HOST:PORT GRPC_HOST:PORT MODEL ROWS_JSON

Prints one JSON object: what each call answered (outputs as lists, ids, readiness, and for a
client mistake the status or code and message the client raised).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

import grpc
import httpx
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest
from kserve.inference_client import RESTConfig


def _input(rows: np.ndarray, binary: bool) -> InferInput:
    inp = InferInput("INPUT0", list(rows.shape), "FP32")
    inp.set_data_from_numpy(rows, binary_data=binary)
    return inp


async def _rest(url: str, model: str, rows: np.ndarray) -> dict[str, Any]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
    out: dict[str, Any] = {
        "ready": [await client.is_server_live(url), await client.is_server_ready(url),
                  await client.is_model_ready(url, model)]}
    asks = {"json": (False, None), "binary": (True, None),
            "binary_out": (True, {"binary_data_output": True})}
    for name, (binary, parameters) in asks.items():
        request = InferRequest(model_name=model, infer_inputs=[_input(rows, binary)],
                               request_id=f"rest-{name}", parameters=parameters)
        answer = await client.infer(url, request, model_name=model)
        out[name] = {"id": answer.id, "name": answer.outputs[0].name,
                     "data": answer.outputs[0].as_numpy().tolist()}
    for name, ask_model, wrong in (("mistake", model, rows[:, :-1]), ("unknown", "nosuch", rows)):
        try:
            await client.infer(url, InferRequest(model_name=ask_model,
                                                 infer_inputs=[_input(wrong, False)]),
                               model_name=ask_model)
            out[name] = "answered"
        except httpx.HTTPStatusError as exc:
            out[name] = [exc.response.status_code, str(exc)]
    await client.close()
    return out


async def _grpc(url: str, model: str, rows: np.ndarray) -> dict[str, Any]:
    client = InferenceGRPCClient(url, timeout=30)
    out: dict[str, Any] = {
        "ready": [await client.is_server_live(), await client.is_server_ready(),
                  await client.is_model_ready(model)]}
    for name, binary in (("raw", True), ("typed", False)):
        answer = await client.infer(InferRequest(
            model_name=model, infer_inputs=[_input(rows, binary)], request_id=f"grpc-{name}"))
        out[name] = {"id": answer.id, "name": answer.outputs[0].name,
                     "data": answer.outputs[0].as_numpy().tolist()}
    for name, ask_model, wrong in (("mistake", model, rows[:, :-1]), ("unknown", "nosuch", rows)):
        try:
            await client.infer(InferRequest(model_name=ask_model,
                                            infer_inputs=[_input(wrong, True)]))
            out[name] = "answered"
        except grpc.aio.AioRpcError as exc:
            out[name] = [exc.code().name, exc.details()]
    await client.close()
    return out


async def _main(http_url: str, grpc_url: str, model: str, rows: np.ndarray) -> dict[str, Any]:
    return {"rest": await _rest(f"http://{http_url}", model, rows),
            "grpc": await _grpc(grpc_url, model, rows)}


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)  # the SDK logs each failed call with its traceback
    http_at, grpc_at, name, given = sys.argv[1:5]
    array = np.array(json.loads(given), dtype=np.float32)
    print(json.dumps(asyncio.run(_main(http_at, grpc_at, name, array))))
