"""What the gRPC tests share: tritonclient.grpc's client and gRPC's stub for a live server, and
the requests and answers of the models they call."""

from __future__ import annotations

import grpc
import numpy as np
import torch
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceStub

from app.models.builtin import linear_module
from tests.conftest import LiveServer


def client_for(srv: LiveServer) -> triton.InferenceServerClient:
    assert srv.grpc_url is not None
    return triton.InferenceServerClient(srv.grpc_url)


def expected(x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return linear_module()(torch.from_numpy(x)).numpy()


def one_input(x: np.ndarray, name: str = "INPUT0") -> triton.InferInput:
    inp = triton.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def stub(srv: LiveServer) -> GRPCInferenceServiceStub:
    assert srv.grpc_url is not None
    return GRPCInferenceServiceStub(grpc.insecure_channel(srv.grpc_url))


def echo_request(value: float) -> pb.ModelInferRequest:
    """One number for the echo model, as typed contents."""
    r = pb.ModelInferRequest(model_name="echo")
    r.inputs.add(name="INPUT0", datatype="FP32", shape=[1],
                 contents=pb.InferTensorContents(fp32_contents=[value]))
    return r
