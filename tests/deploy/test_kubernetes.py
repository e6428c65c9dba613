"""deploy/kubernetes: every kustomization renders and passes the Kubernetes schemas, and what the
manifests say about the app (probe paths and ports, settings, the KEDA trigger, the KServe
runtime's flags) agrees with the app itself; the server, run with the pod's settings and volumes,
writes nothing outside its writable /tmp. The custom resources (KEDA, KServe) are checked against
their projects' API types (tests/deploy/custom_resources.py)."""

from __future__ import annotations

import asyncio
import copy
import operator
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from app.cli import _settings, build_parser
from app.config import Settings
from app.supervisor import AUTO_LIMIT, frontend_count
from tests.conftest import (
    WAIT_S,
    app_client,
    free_port,
    make_settings,
    queued,
    serve,
    wait_ready,
    wait_until,
)
from tests.deploy import custom_resources
from tests.fakes import GatedHandler, SlowLoadHandler

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
TARGETS = ["overlays/cpu", "overlays/gpu", "workers"]  # and kserve: only custom resources
KUBERNETES_VERSION = "1.30.0"  # the oldest release still supported when this was written
VERSIONS = [KUBERNETES_VERSION, kubernetes_validate.latest_version()]  # and the newest known
CUSTOM_GROUPS = ("keda.sh/", "serving.kserve.io/")  # checked by tests/deploy/custom_resources.py


def render(target: str) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of one kustomization: its resources, as applied."""
    kubectl = shutil.which("kubectl") or shutil.which("kubectl", path=Path(sys.executable).parent)
    if kubectl is None:
        pytest.skip("needs kubectl (.ci/run installs it)")
    out = subprocess.run([kubectl, "kustomize", str(KUBE / target)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind
               and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"one {kind} {name or ''} expected, got {len(matches)}"
    return matches[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def environment(docs: list[dict[str, Any]], spec: dict[str, Any]) -> dict[str, str]:
    """A container's environment: its ConfigMaps (envFrom), then its own plain values."""
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        env.update(find(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in spec.get("env", []) if "value" in e})
    return env


def settings_from(env: dict[str, str], args: list[str], monkeypatch: pytest.MonkeyPatch
                  ) -> Settings:
    """The settings the server would start with, given this environment and these flags."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return _settings(build_parser().parse_args(["serve", *args]))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_every_kustomization_renders_and_passes_the_schemas(target: str, version: str) -> None:
    docs = render(target)
    checked = [d for d in docs if not d["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert checked, "nothing to check"
    for doc in checked:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_catches_a_mistake() -> None:
    deployment = find(render("overlays/cpu"), "Deployment")
    broken = copy.deepcopy(deployment)
    container(broken)["readinessProbe"]["httpGet"]["pathh"] = "/health_check"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("target", ["workers", "kserve"])
def test_every_custom_resource_passes_its_projects_api_types(target: str) -> None:
    custom = [d for d in render(target) if d["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert custom, "nothing to check"
    for doc in custom:
        custom_resources.check(doc)


def _parent(doc: dict[str, Any], path: str) -> tuple[Any, Any]:
    """The container of the field at ``path`` (dots; a number indexes a list), and its key."""
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node: Any = doc
    for key in parents:
        node = node[key]
    return node, last


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: operator.setitem(*_parent(doc, path), value)


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    return lambda doc: operator.delitem(*_parent(doc, path))


@pytest.mark.parametrize(("target", "kind", "change"), [
    ("workers", "ScaledObject", _set("spec.scaleTargetRef.nmae", "batchserve-worker")),
    ("workers", "ScaledObject", _set("spec.triggers.0.metadata.lagCount", 64)),  # KEDA: strings
    ("workers", "ScaledObject", _set("spec.minReplicaCount", "0")),
    ("workers", "ScaledObject", _drop("spec.triggers.0.type")),
    ("kserve", "ClusterServingRuntime", _set("spec.containers.0.imagee", "batchserve")),
    ("kserve", "ClusterServingRuntime", _set("spec.supportedModelFormats.0.autoSelect", "true")),
    ("kserve", "ClusterServingRuntime", _drop("spec.containers.0.name")),
    ("kserve", "ClusterServingRuntime",
     _set("spec.containers.0.readinessProbe.httpGet.pathh", "/health_check")),
    ("kserve", "InferenceService", _set("spec.predictor.model.storageURI", "pvc://x")),
    ("kserve", "InferenceService", _set("spec.predictor.minReplicas", "1")),
], ids=["unknown field", "number for string", "string for number", "required field missing",
        "container typo", "string for bool", "container without name", "probe typo",
        "model field typo", "replicas as string"])
def test_the_custom_resource_check_catches_a_mistake(
        target: str, kind: str, change: Callable[[dict[str, Any]], None]) -> None:
    doc = copy.deepcopy(find(render(target), kind))
    custom_resources.check(doc)
    change(doc)
    with pytest.raises(custom_resources.SchemaError):
        custom_resources.check(doc)


def test_a_custom_kind_without_a_schema_is_an_error() -> None:
    with pytest.raises(custom_resources.SchemaError, match="no schema"):
        custom_resources.check({"apiVersion": "keda.sh/v1alpha1", "kind": "ClusterScaledThing",
                                "metadata": {"name": "x"}})


def probes(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {kind: spec[kind + "Probe"]["httpGet"] for kind in ("readiness", "liveness", "startup")
            if kind + "Probe" in spec}


def test_the_servers_probes_ports_and_grace_agree_with_the_app(
        monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render("overlays/cpu")
    deployment = find(docs, "Deployment", "batchserve")
    spec = container(deployment)
    settings = settings_from(environment(docs, spec), [], monkeypatch)
    named = {p["name"]: p["containerPort"] for p in spec["ports"]}
    for probe in probes(spec).values():
        assert named[probe["port"]] == settings.port
    assert named["grpc"] == settings.grpc_port != 0
    service = find(docs, "Service", "batchserve")
    assert all(p["targetPort"] in named for p in service["spec"]["ports"])
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    # The models the ConfigMap volume holds are the repository the settings point at.
    mount = next(m for m in spec["volumeMounts"] if m["name"] == "models")
    assert mount["mountPath"] == settings.model_repository
    # SIGTERM drains for up to request_timeout_s + 5 s, after the preStop sleep.
    pod = deployment["spec"]["template"]["spec"]
    pre_stop = int(spec["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + settings.request_timeout_s + 5
    assert spec["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["env"][[e["name"] for e in spec["env"]].index("BATCHSERVE_API_KEY")][
        "valueFrom"]["secretKeyRef"]["optional"] is True


@pytest.mark.parametrize(("overlay", "dockerfile"), [("cpu", "Dockerfile"),
                                                     ("gpu", "Dockerfile.cuda")])
def test_each_overlays_pods_are_guarded_and_sized(overlay: str, dockerfile: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(f"overlays/{overlay}")
    deployment = find(docs, "Deployment", "batchserve")
    pod, spec = deployment["spec"]["template"]["spec"], container(deployment)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    # The PodDisruptionBudget covers these pods (without a selector it would cover none).
    selector = find(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert selector and selector.items() <= labels.items()
    # Non-root, as the image's own user.
    uid = re.search(r"useradd .*--uid (\d+)", (ROOT / "docker" / dockerfile).read_text())
    assert uid is not None
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(uid[1])
    # Requests and limits set; the startup probe allows the 5 minutes the docs promise.
    assert spec["resources"]["requests"] and spec["resources"]["limits"]
    startup = spec["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    settings = settings_from(environment(docs, spec), [], monkeypatch)
    tag = spec["image"].rsplit(":", 1)[1]
    if overlay == "cpu":
        assert tag == "cpu" and settings.torch_threads == int(spec["resources"]["limits"]["cpu"])
    else:
        assert tag == "cuda" and spec["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert settings.devices == "cuda"
        # Its CPU limit is what auto counts (a quota): enough for all the front ends it runs.
        cores = int(spec["resources"]["limits"]["cpu"])
        assert settings.frontends == "auto" and frontend_count("auto", cores) == AUTO_LIMIT


WRITE_CALLS = ("openat", "open", "creat", "mkdir", "mkdirat", "rename", "renameat", "renameat2",
               "unlink", "unlinkat", "rmdir", "truncate", "symlink", "symlinkat", "link", "linkat")
WRITES = re.compile(rf"^({'|'.join(WRITE_CALLS)})\((.*)\)\s+=\s+(-?\d+)")


def _written(trace_dir: Path) -> set[str]:
    """Paths that a traced process tree changed or opened for writing (strace -ff files)."""
    paths: set[str] = set()
    for log in trace_dir.iterdir():
        for line in log.read_text(errors="replace").splitlines():
            call = WRITES.match(line)
            if call is None or call[3].startswith("-"):
                continue
            name, args = call[1], call[2]
            if name in ("openat", "open") and not re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC",
                                                            args):
                continue
            paths.update(re.findall(r'"([^"]*)"', args))
    return paths


def test_the_server_writes_only_where_the_pod_lets_it(tmp_path: Path) -> None:
    """The Deployment's read-only root filesystem holds: the server, started with the pod's
    settings and its volumes, serves both models and drains on SIGTERM, writing nowhere but its
    emptyDir /tmp. Pod paths are mapped into ``tmp_path``; strace records every write."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("needs strace (.ci/run installs it)")
    docs = render("overlays/cpu")
    deployment = find(docs, "Deployment", "batchserve")
    spec = container(deployment)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {}
    for mount in spec["volumeMounts"]:
        local = tmp_path / mount["name"]
        local.mkdir()
        source = volumes[mount["name"]]
        if "configMap" in source:  # the models: each item's key as a file at its path
            data = find(docs, "ConfigMap", source["configMap"]["name"])["data"]
            for item in source["configMap"]["items"]:
                (local / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (local / item["path"]).write_text(data[item["key"]])
        mounts[mount["mountPath"]] = str(local)
    writable = mounts["/tmp"]  # the emptyDir; everything else is read-only in the pod

    def local(value: str) -> str:
        for pod_path, path in mounts.items():
            if value == pod_path or value.startswith(pod_path + "/"):
                return path + value[len(pod_path):]
        return value

    env = {name: local(value) for name, value in environment(docs, spec).items()}
    env.update(TMPDIR=writable, PYTHONDONTWRITEBYTECODE="1")  # the image has its .pyc files
    # The pod's gRPC listener is a fixed port on every address; here a free loopback one.
    env.update(BATCHSERVE_HOST="127.0.0.1", BATCHSERVE_GRPC_PORT=str(free_port()))
    traces = tmp_path / "strace"
    traces.mkdir()
    wrap = (strace, "-qq", "-f", "-ff", "--seccomp-bpf", "-o", str(traces / "t"),
            "-e", "trace=" + ",".join(WRITE_CALLS))
    with serve(env=env, wrap=wrap) as (proc, url):
        wait_ready(url)
        embed = httpx.post(url + "/predict", json={"instances": ["a pod", "on a cluster"]})
        assert embed.status_code == 200 and len(embed.json()["predictions"]) == 2
        classify = httpx.post(url + "/v2/models/classify/infer", json={"inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        assert classify.status_code == 200, classify.text
        assert httpx.get(url + "/metrics").status_code == 200
        # SIGTERM to the server itself (strace's child); strace exits with its status.
        (server,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        os.kill(int(server), signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
    written = _written(traces)
    outside = sorted(p for p in written
                     if not p.startswith((writable + "/", "/dev/", "/proc/")) and p != writable)
    assert outside == [], f"writes outside the pod's writable /tmp: {outside}"


def test_the_shipped_model_configs_are_the_repository_examples() -> None:
    for name in ("embed", "classify"):
        shipped = (KUBE / "base" / "models" / f"{name}.toml").read_text()
        assert shipped == (ROOT / "config" / "repository" / name / "config.toml").read_text()


@pytest.mark.asyncio
async def test_the_probe_paths_answer_as_their_roles_need() -> None:
    """Readiness takes a busy or loading pod out of the Service; liveness never restarts a busy
    one; the startup probe waits for the models: tried on the app with the manifest's paths."""
    paths = probes(container(find(render("overlays/cpu"), "Deployment", "batchserve")))
    ready, live, startup = (paths[k]["path"] for k in ("readiness", "liveness", "startup"))
    handler = GatedHandler()
    async with app_client(make_settings(queue_capacity=1, max_instances=1), handler) as client:
        assert [(await client.get(p)).status_code for p in (ready, live, startup)] == [200] * 3
        first = asyncio.create_task(client.post("/predict", json={"instances": [1]}))
        await wait_until(handler.entered.is_set, "device busy")
        held = asyncio.create_task(client.post("/predict", json={"instances": [2]}))
        await wait_until(lambda: queued(client) == 1, "queue full")
        assert (await client.get(ready)).status_code == 503  # busy: no new traffic
        assert (await client.get(live)).status_code == 200  # but alive
        assert (await client.get(startup)).status_code == 200  # and started
        handler.gate.set()
        await asyncio.gather(first, held)
    loading = SlowLoadHandler()
    async with app_client(make_settings(), loading, wait_ready=False) as client:
        assert (await client.get(startup)).status_code == 503  # liveness waits for the models
        assert (await client.get(live)).status_code == 200
        loading.loaded.set()


def test_the_hpa_scales_on_a_metric_the_adapter_serves() -> None:
    hpa = find(render("overlays/cpu"), "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "batchserve"
    names = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    adapter = yaml.safe_load((ROOT / "deploy" / "prometheus" / "adapter-rules.yaml").read_text())
    served = {rule["name"]["as"] for rule in adapter["rules"]}
    assert names and names <= served


def test_the_keda_trigger_reads_the_stream_the_workers_serve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render("workers")
    scaled = find(docs, "ScaledObject")
    workers = find(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
    spec = container(workers)
    assert spec["command"] == ["batchserve", "worker"]
    settings = settings_from(environment(docs, spec), [], monkeypatch)
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "redis-streams" and int(meta["lagCount"]) > 0
    assert meta["stream"] == settings.job_stream and meta["consumerGroup"] == settings.job_group
    host, port = meta["address"].split(":")
    assert settings.redis_url.startswith(f"redis://{host}:{port}/")
    redis = find(docs, "Service", host)
    assert int(port) in [p["port"] for p in redis["spec"]["ports"]]
    assert settings.worker_metrics_port == workers["spec"]["template"]["spec"]["containers"][0][
        "ports"][0]["containerPort"]


def test_the_kserve_runtime_starts_the_server_on_its_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render("kserve")
    runtime = find(docs, "ClusterServingRuntime")
    service = find(docs, "InferenceService")
    (spec,) = runtime["spec"]["containers"]
    assert spec["name"] == "kserve-container"  # the name KServe injects storage and env into
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runtime"},
           "spec": {"containers": [spec]}}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    settings = settings_from(environment(docs, spec), spec["args"], monkeypatch)
    assert settings.model_repository == "/mnt/models"  # where KServe's storage initializer puts it
    assert [p["containerPort"] for p in spec["ports"]] == [settings.port, settings.grpc_port]
    assert spec["ports"][1]["name"] == "h2c"  # the port KServe routes grpc-v2 to
    assert settings.host == "0.0.0.0"
    assert {k: v["path"] for k, v in probes(spec).items()} == {
        "readiness": "/health_check", "liveness": "/v2/health/live"}
    assert {"v2", "grpc-v2"} <= set(runtime["spec"]["protocolVersions"])
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in [f["name"] for f in
                                            runtime["spec"]["supportedModelFormats"]]
