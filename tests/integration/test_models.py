"""Several models over HTTP, driven by the stock tritonclient: the repository extension,
versions swapped under traffic, per-model routes, health and limits."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import LiveServer, live_server, make_settings, sample
from tests.fakes import export_scale

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("exported")
    return {k: export_scale(root / f"scale{k}.pt2", float(k)) for k in (1, 2)}


def add_version(repo: Path, name: str, version: int, program: Path) -> None:
    (repo / name / str(version)).mkdir(parents=True, exist_ok=True)
    shutil.copy(program, repo / name / str(version) / "model.pt2")


@pytest.fixture
def repo(tmp_path: Path, exported: dict[int, Path]) -> Path:
    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "config.toml").write_text('model = "tests.fakes:EchoHandler"\n')
    (tmp_path / "lin").mkdir()
    (tmp_path / "lin" / "config.toml").write_text('model = "linear"\nmax_batch_size = 4\n')
    add_version(tmp_path, "scale", 1, exported[1])
    return tmp_path


@pytest.fixture
def server(repo: Path) -> Iterator[LiveServer]:
    settings = make_settings(model_repository=str(repo), model_control_mode="explicit",
                             load_model=["echo", "scale"], default_model="echo")
    with live_server(settings) as srv:
        yield srv


def client(srv: LiveServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(srv.url.removeprefix("http://"), concurrency=4)


def scale_input(rows: int = 1) -> triton.InferInput:
    x = triton.InferInput("INPUT0", [rows, 3], "FP32")
    x.set_data_from_numpy(np.ones((rows, 3), dtype=np.float32))
    return x


def test_the_repository_index_load_and_unload(server: LiveServer) -> None:
    c = client(server)
    index = {(e["name"], e.get("version", "")): e for e in c.get_model_repository_index()}
    assert index[("echo", "1")]["state"] == "READY" and index[("scale", "1")]["state"] == "READY"
    assert index[("lin", "")] == {"name": "lin", "version": "", "state": "UNAVAILABLE",
                                  "reason": "unloaded"}
    assert not c.is_model_ready("lin")
    c.load_model("lin")
    assert c.is_model_ready("lin") and c.get_model_config("lin")["max_batch_size"] == 4
    c.load_model("lin", config=json.dumps({"max_batch_size": 2}))  # reload with a config
    assert c.get_model_config("lin")["max_batch_size"] == 2
    c.unload_model("lin")
    assert not c.is_model_ready("lin")
    with pytest.raises(InferenceServerException, match="unknown model 'lin'"):
        c.get_model_metadata("lin")
    with pytest.raises(InferenceServerException, match="no such model"):
        c.load_model("nope")
    r = httpx.post(server.url + "/v2/repository/models/lin/load",
                   json={"parameters": {"config": "{not json"}})
    assert r.status_code == 400 and "'config' is not valid JSON" in r.json()["error"]
    ready = httpx.post(server.url + "/v2/repository/index", json={"ready": True}).json()
    assert {e["name"] for e in ready} == {"echo", "scale"}


def test_each_model_has_its_routes(server: LiveServer) -> None:
    r = httpx.post(server.url + "/predict", json={"instances": [1, 2]})  # the default model
    assert r.json() == {"predictions": [2.0, 4.0]}
    r = httpx.post(server.url + "/models/scale/predict", json={"instances": [[1, 2, 3]]})
    assert r.json() == {"predictions": [[1.0, 2.0, 3.0]]}
    r = httpx.post(server.url + "/models/scale/versions/1/predict",
                   json={"instances": [[1, 1, 1]]})
    assert r.status_code == 200
    r = httpx.post(server.url + "/models/scale/versions/9/predict", json={"instances": [[1]]})
    assert r.status_code == 404 and "no version '9'" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/models/nope/predict", json={"instances": [1]})
    assert r.status_code == 404
    got = client(server).infer("scale", [scale_input()], model_version="1").as_numpy("OUTPUT0")
    assert got.tolist() == [[1.0, 1.0, 1.0]]
    assert client(server).get_model_metadata("scale", "1")["versions"] == ["1"]


def test_health_per_model(server: LiveServer) -> None:
    health = httpx.get(server.url + "/health_check").json()
    assert health["status"] == "ready"
    assert {(m["model"], m["status"]) for m in health["models"]} == {("echo", "ready"),
                                                                    ("scale", "ready")}
    r = httpx.get(server.url + "/health_check", params={"model": "scale"})
    assert r.status_code == 200 and r.json()["model"] == "scale"
    assert httpx.get(server.url + "/health_check", params={"model": "lin"}).status_code == 404


def test_a_new_version_swaps_in_under_traffic(server: LiveServer, repo: Path,
                                              exported: dict[int, Path]) -> None:
    """tritonclient traffic on the model's default version while v2 is added and loaded: every
    request answered exactly once, by v1 or v2 (never a half-loaded one), none refused."""
    answers: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def traffic() -> None:
        c = client(server)
        while not stop.is_set():
            try:
                answers.append(float(c.infer("scale", [scale_input()]).as_numpy("OUTPUT0")[0, 0]))
            except BaseException as exc:  # noqa: BLE001 - every failure is counted
                errors.append(exc)

    registry = server.app.state.service.metrics.registry
    before = sample(registry, "batchserve_requests_total", model="scale")
    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        while len(answers) < 40:
            threading.Event().wait(0.01)
        add_version(repo, "scale", 2, exported[2])
        client(server).load_model("scale")  # answers once v2 serves and v1 has drained
        count = len(answers)
        while len(answers) < count + 40:
            threading.Event().wait(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert set(answers) == {1.0, 2.0} and answers[-1] == 2.0
    counted = sample(registry, "batchserve_requests_total", model="scale") - before
    assert counted == len(answers)  # answered exactly once each
    index = client(server).get_model_repository_index()
    assert [(e["version"], e["state"]) for e in index if e["name"] == "scale"] == [("2", "READY")]


def test_control_routes_need_the_api_key(repo: Path) -> None:
    settings = make_settings(model_repository=str(repo), model_control_mode="explicit",
                             load_model=["echo"], api_key="s3cret")
    with live_server(settings) as srv:
        c = client(srv)
        with pytest.raises(InferenceServerException, match="401|bearer"):
            c.load_model("lin")
        with pytest.raises(InferenceServerException, match="401|bearer"):
            c.unload_model("echo")
        authorized = {"Authorization": "Bearer s3cret"}
        c.load_model("lin", headers=authorized)
        c.unload_model("lin", headers=authorized)
        assert c.get_model_repository_index()  # the index is open, as metadata is
