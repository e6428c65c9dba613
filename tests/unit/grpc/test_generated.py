"""app/grpc/inference_pb2*.py are what .ci/protos generates from app/grpc/inference.proto, and
live beside tritonclient.grpc's own `inference.*` messages in one program."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ("inference_pb2.py", "inference_pb2.pyi")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_committed_modules_are_what_the_proto_generates(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    proc = subprocess.run(["bash", str(ROOT / ".ci" / "protos"), str(tmp_path)],
                          env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in GENERATED:
        assert (tmp_path / name).read_text() == (ROOT / "app" / "grpc" / name).read_text(), \
            f"app/grpc/{name} is stale: run bash .ci/protos"


def test_ours_and_tritonclients_messages_share_a_program() -> None:
    """The same full names in two descriptor pools: both import, and each reads the other's
    bytes (the field numbers are the wire's). tritonclient comes with the dev extra; the GPU
    box's carry (bench/carry.py) has no room for it."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

    from app.grpc import inference_pb2 as pb

    ours = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x01"])
    ours.parameters["priority"].uint64_param = 3
    theirs = service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert theirs.model_name == "m" and theirs.parameters["priority"].uint64_param == 3
    assert pb.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
    assert pb.ModelInferRequest.FromString(theirs.SerializeToString()) == ours
