"""No Docker engine runs here: run the image's own ENTRYPOINT, ENV and HEALTHCHECK directly."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton

from tests.conftest import WAIT_S, free_port, free_socket, wait_until_sync

pytestmark = pytest.mark.slow
DOCKERFILE = Path(__file__).resolve().parents[2] / "docker" / "Dockerfile"


def final_stage() -> list[str]:
    """Instructions of the last stage, with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stripped = (ln.strip() for ln in text.splitlines())
    lines = [ln for ln in stripped if ln and not ln.startswith("#")]
    last_from = max(i for i, ln in enumerate(lines) if ln.startswith("FROM "))
    return lines[last_from:]


def image_env(stage: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in stage:
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                if "$" not in value:  # PATH=/opt/venv/bin:$PATH: this checkout's venv stands in
                    env[key] = value
    return env


def test_entrypoint_starts_and_serves() -> None:
    stage = final_stage()
    entrypoint = json.loads(next(ln for ln in stage if ln.startswith("ENTRYPOINT "))[11:])
    assert entrypoint == ["batchserve", "serve"] and "STOPSIGNAL SIGTERM" in stage
    assert any(ln.startswith("USER ") and ln != "USER root" for ln in stage)
    healthcheck = json.loads(next(ln for ln in stage if ln.startswith("HEALTHCHECK"))
                             .split("CMD", 1)[1])
    env = {**os.environ, **image_env(stage)}
    assert env["BATCHSERVE_HOST"] == "0.0.0.0" and env["HF_HUB_OFFLINE"] == "1"
    assert "EXPOSE 8000 8001" in stage  # HTTP, and gRPC on its default port
    # gRPC binds by host and port: loopback and a free port here, not the image's 0.0.0.0:8001.
    grpc_port = free_port()
    env |= {"BATCHSERVE_HOST": "127.0.0.1", "BATCHSERVE_GRPC_PORT": str(grpc_port)}
    exe = Path(sys.executable).parent / entrypoint[0]
    sock = free_socket()  # the test binds loopback; the image's 0.0.0.0 is not used here
    port = sock.getsockname()[1]
    proc = subprocess.Popen([str(exe), *entrypoint[1:], "--fd", str(sock.fileno())],
                            pass_fds=[sock.fileno()], env=env, stderr=subprocess.PIPE)
    sock.close()
    url = f"http://127.0.0.1:{port}"
    # The check as the image runs it, at the port BATCHSERVE_PORT names (here the bound one).
    probe = [sys.executable if a == "python" else a for a in healthcheck]
    probe_env = {**env, "BATCHSERVE_PORT": str(port)}
    try:
        assert subprocess.run(probe, capture_output=True, timeout=WAIT_S,
                              env=probe_env).returncode != 0

        def healthy() -> bool:
            return subprocess.run(probe, capture_output=True, timeout=WAIT_S,
                                  env=probe_env).returncode == 0

        wait_until_sync(healthy, "the image's HEALTHCHECK passing")
        r = httpx.post(url + "/predict", json={"instances": ["hello from the image"]}, timeout=60)
        assert r.status_code == 200 and len(r.json()["predictions"][0]) == 384
        texts = triton.InferInput("INPUT0", [1], "BYTES")
        texts.set_data_from_numpy(np.array([b"hello from the image"], dtype=object))
        grpc_client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert grpc_client.infer("minilm", [texts]).as_numpy("OUTPUT0").shape == (1, 384)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
        logs = proc.stderr.read().decode().splitlines()  # type: ignore[union-attr]
        assert logs and all(json.loads(line)["level"] for line in logs)  # BATCHSERVE_LOG_FORMAT
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT_S)
        proc.stderr.close()  # type: ignore[union-attr]
