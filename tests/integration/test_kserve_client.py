"""KServe's own v2 clients (the ``kserve`` SDK, as KServe's transformers and graphs call a
predictor) drive the server over HTTP (JSON and binary tensors, binary answers) and gRPC (raw
and typed tensors), in one process and with two front ends: the answers are the model's, each
request's id comes back, and a client mistake or an unknown model raises in the client with
the server's message (tests/kserve_client.py, a child process: see there why)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

from app.models.builtin import linear_module
from tests.conftest import ROOT, WAIT_S, free_port, live_server, make_settings, split_server

pytestmark = pytest.mark.slow

ROWS = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


@contextmanager
def _server(frontends: int) -> Iterator[tuple[str, str]]:
    """(HTTP host:port, gRPC host:port) of a ``linear`` server."""
    if frontends == 1:
        with live_server(make_settings(model="linear"), grpc=True) as srv:
            assert srv.grpc_url is not None
            yield srv.url.removeprefix("http://"), srv.grpc_url
        return
    grpc_port = free_port()
    with split_server("--model", "linear", "--frontends", "2",
                      "--grpc-port", str(grpc_port)) as (_, url):
        yield url.removeprefix("http://"), f"127.0.0.1:{grpc_port}"


def _kserve_calls(http_url: str, grpc_url: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kserve_client", http_url, grpc_url, "linear",
         json.dumps(ROWS.tolist())], cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout))


@pytest.mark.parametrize("frontends", [1, 2])
def test_kserve_clients_over_http_and_grpc(frontends: int) -> None:
    with _server(frontends) as (http_url, grpc_url):
        got = _kserve_calls(http_url, grpc_url)
    with torch.inference_mode():
        want = linear_module()(torch.from_numpy(ROWS)).numpy()
    rest, grpc = got["rest"], got["grpc"]
    assert rest["ready"] == grpc["ready"] == [True, True, True]
    for side, names in ((rest, ("json", "binary", "binary_out")), (grpc, ("raw", "typed"))):
        for name in names:
            answer = side[name]
            assert answer["id"].endswith("-" + name) and answer["name"] == "OUTPUT0"
            np.testing.assert_allclose(np.array(answer["data"], np.float32), want, rtol=1e-6)
    assert rest["mistake"][0] == 400 and "expected shape [4], got [3]" in rest["mistake"][1]
    assert rest["unknown"][0] == 404 and "unknown model 'nosuch'" in rest["unknown"][1]
    assert grpc["mistake"][0] == "INVALID_ARGUMENT"
    assert "expected shape [4], got [3]" in grpc["mistake"][1]
    assert grpc["unknown"][0] == "NOT_FOUND" and "unknown model 'nosuch'" in grpc["unknown"][1]
