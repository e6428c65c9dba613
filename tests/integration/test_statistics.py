"""Triton's statistics extension, read by the stock tritonclient over HTTP and gRPC
(``get_inference_statistics``): the requests a server answered, counted once each."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from tests.conftest import live_server, make_settings
from tests.grpc_clients import client_for, one_input

pytestmark = pytest.mark.slow


def test_each_request_item_and_call_is_counted_and_both_protocols_agree() -> None:
    with live_server(make_settings(max_instances=8), grpc=True) as srv:
        rows = np.ones((2, 4), np.float32)
        http = triton_http.InferenceServerClient(srv.url.removeprefix("http://"))
        x = triton_http.InferInput("INPUT0", [2, 4], "FP32")
        x.set_data_from_numpy(rows)
        http.infer("linear", [x])
        client_for(srv).infer("linear", [one_input(rows[:1])])
        with pytest.raises(InferenceServerException):
            client_for(srv).infer("linear", [one_input(np.ones((1, 3), np.float32))])

        over_http = http.get_inference_statistics("linear")
        (stats,) = over_http["model_stats"]
        figures = stats["inference_stats"]
        assert (stats["name"], stats["version"]) == ("linear", "1")
        assert (figures["success"]["count"], figures["fail"]["count"]) == (2, 1)
        assert stats["inference_count"] == figures["queue"]["count"] == 3  # items: rows
        assert figures["compute_input"]["count"] == figures["compute_infer"]["count"] \
            == figures["compute_output"]["count"] == 3  # perf_analyzer requires them equal
        assert figures["compute_infer"]["ns"] > 0 and figures["success"]["ns"] > 0
        batches = stats["batch_stats"]
        assert sum(b["compute_infer"]["count"] for b in batches) == stats["execution_count"]
        assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == 3
        assert stats["last_inference"] > 0

        over_grpc = client_for(srv).get_inference_statistics("linear", "1")
        assert json_format.MessageToDict(over_grpc, preserving_proto_field_name=True) == \
            json_format.MessageToDict(json_format.ParseDict(over_http, type(over_grpc)()),
                                      preserving_proto_field_name=True)
        everything = http.get_inference_statistics()["model_stats"]
        assert [s["name"] for s in everything] == ["linear"]
        assert "statistics" in http.get_server_metadata()["extensions"]


def test_an_unknown_model_or_version_is_not_found() -> None:
    with live_server(make_settings(), grpc=True) as srv:
        for path in ("/v2/models/nope/stats", "/v2/models/linear/versions/9/stats"):
            answer = httpx.get(srv.url + path)
            assert answer.status_code == 404 and "error" in answer.json()
        with pytest.raises(InferenceServerException) as unknown:
            client_for(srv).get_inference_statistics("nope")
        assert unknown.value.status() == str(grpc.StatusCode.NOT_FOUND)
