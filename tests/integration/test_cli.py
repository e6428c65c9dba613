"""``batchserve serve`` as a real process: SIGTERM draining, the default minilm model, errors."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.conftest import (
    QUIET_ENV,
    WAIT_S,
    free_socket,
    sample,
    serve,
    wait_ready,
    wait_until_sync,
)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_answers_everything_in_flight_then_exits_0(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    args = ("--model", "tests.fakes:gate_file_module", "--devices", "cpu", "--max-batch-size", "2")
    with serve(*args, env={"GATE_FILE": str(gate)}) as (proc, url):
        wait_ready(url)
        with ThreadPoolExecutor(6) as pool:
            futures = [
                pool.submit(httpx.post, url + "/predict", json={"instances": [[i, i]]}, timeout=60)
                for i in range(6)
            ]
            wait_until_sync(
                lambda: sample(httpx.get(url + "/metrics", timeout=5).text,
                               "batchserve_in_flight_requests") == 6,
                "6 requests in flight",
            )
            proc.send_signal(signal.SIGTERM)
            wait_until_sync(
                lambda: httpx.get(url + "/health_check", timeout=5).json()["status"] == "draining",
                "draining",
            )
            health = httpx.get(url + "/health_check", timeout=5)
            assert health.status_code == 503
            late = httpx.post(url + "/predict", json={"instances": [[9, 9]]}, timeout=5)
            assert late.status_code == 503 and late.json()["error"]["type"] == "draining"
            gate.touch()
            responses = [f.result() for f in futures]
        assert [r.status_code for r in responses] == [200] * 6
        assert [r.json()["predictions"] for r in responses] == [[[2 * i, 2 * i]] for i in range(6)]
        assert proc.wait(WAIT_S) == 0


def test_default_model_serves_correct_embeddings() -> None:
    from sentence_transformers import SentenceTransformer

    from app.models.minilm import model_dir

    texts = ["A man is eating food.", "Dynamic batching on a CPU", "", "Übung macht den Meister"]
    with serve("--devices", "cpu") as (proc, url):  # every other setting at its default
        wait_ready(url)
        r = httpx.post(url + "/predict", json={"instances": texts}, timeout=60)
        assert r.status_code == 200
        got = r.json()["predictions"]
        r = httpx.post(url + "/predict", json={"instances": [1]}, timeout=60)
        assert r.status_code == 422 and "expected a string" in r.json()["error"]["message"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
    reference = SentenceTransformer(str(model_dir()), device="cpu").encode(texts)
    assert len(got) == 4 and all(len(v) == 384 for v in got)
    assert max(abs(a - b) for v, ref in zip(got, reference, strict=True)
               for a, b in zip(v, ref, strict=True)) < 1e-5


def json_logs_of_a_predict(headers: dict[str, str], *args: str,
                           env: dict[str, str] | None = None) -> tuple[httpx.Response,
                                                                     list[dict[str, Any]]]:
    """One /predict with ``headers`` to a server (``args``) logging JSON, stopped by SIGTERM:
    the answer and every line it logged."""
    with serve("--model", "linear", "--devices", "cpu", "--log-format", "json", *args,
               env=env, stderr=subprocess.PIPE) as (proc, url):
        wait_ready(url)
        r = httpx.post(url + "/predict", json={"instances": [[1, 2, 3, 4]]}, headers=headers,
                       timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
        return r, [json.loads(line) for line in proc.stderr.read().decode().splitlines() if line]


def predict_access(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in lines if e["logger"] == "batchserve.access" and e["path"] == "/predict"]


def test_json_logs_carry_the_request_id() -> None:
    r, lines = json_logs_of_a_predict({"X-Request-ID": "trace-42"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42"
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in lines)
    access = predict_access(lines)
    assert access and access[0]["request_id"] == "trace-42" and access[0]["status"] == 200


@pytest.mark.parametrize(("trusted", "client"), [(None, "10.1.2.3"), ("10.9.9.9", "127.0.0.1")])
def test_the_access_log_names_the_client_a_trusted_proxy_forwards_for(
        trusted: str | None, client: str) -> None:
    """A request's client is the peer, or the address its X-Forwarded-For names where the peer
    is a trusted proxy: 127.0.0.1 and ::1 (a sidecar) unless uvicorn's FORWARDED_ALLOW_IPS
    names others (docs/deployment.md); in front ends as in one process."""
    env = {} if trusted is None else {"FORWARDED_ALLOW_IPS": trusted}
    r, lines = json_logs_of_a_predict({"X-Forwarded-For": "10.1.2.3"}, "--frontends", "2",
                                      env=env)
    assert r.status_code == 200
    assert [e["client"] for e in predict_access(lines)] == [client]


def test_start_up_says_what_it_does_and_probes_are_logged_when_they_change() -> None:
    with serve("--model", "linear", "--devices", "cpu", stderr=subprocess.PIPE) as (proc, url):
        wait_ready(url)
        for _ in range(5):
            assert httpx.get(url + "/health_check", timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
        lines = proc.stderr.read().decode().splitlines()
    said = "\n".join(lines)
    assert "model linear version 1: loading and warming up on cpu" in said
    assert re.search(r"model linear version 1: warm on cpu in [0-9.]+ s", said)
    assert re.search(r"INFO batchserve .*: ready in [0-9.]+ s", said)
    assert re.search(r"INFO batchserve .*: draining: new requests refused; answering the 0 in "
                     r"flight, within \d+ s at most", said)
    assert re.search(r"INFO batchserve .*: drained in [0-9.]+ s", said)
    probes = [line for line in lines if '"GET /health_check" 200' in line]
    assert len(probes) == 1, probes  # six answered 200, one line


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_a_log_pipe_nobody_reads_does_not_stop_the_server(frontends: str) -> None:
    """At info each request writes an access line. With stderr a pipe nobody reads, 64 KB of
    lines fill it; the server serves on (its lines wait for the reader, app/logs.py) and,
    once read, the log says how many lines it dropped or has them all."""
    with serve("--model", "linear", "--devices", "cpu", "--frontends", frontends,
               stderr=subprocess.PIPE) as (proc, url):
        wait_ready(url)
        body = {"instances": [[1, 2, 3, 4]]}
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(1500):  # about 200 KB of access lines
                assert client.post("/predict", json=body).status_code == 200
            assert client.get("/health_check").status_code == 200
        proc.send_signal(signal.SIGTERM)
        said = proc.communicate(timeout=WAIT_S)[1].decode()  # read at last
        assert proc.returncode == 0
    assert "drained in" in said and "Traceback" not in said
    assert said.count('"POST /predict" 200') == 1500


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_path_cannot_forge_a_log_line(log_format: str) -> None:
    """A decoded %0a in a request's path (its 404 logged by the access log and the error) stays
    inside its own line, escaped; so does a %00."""
    with serve("--model", "linear", "--devices", "cpu", "--log-format", log_format,
               stderr=subprocess.PIPE) as (proc, url):
        wait_ready(url)
        r = httpx.post(url + "/models/x%0aCRITICAL%20batchserve%20forged%00/predict",
                       json={"instances": [[1, 2, 3, 4]]}, timeout=60)
        assert r.status_code == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
        lines = proc.stderr.read().decode().splitlines()
    assert not [line for line in lines if line.startswith("CRITICAL")]
    assert not [line for line in lines if "\x00" in line]
    forged = [line for line in lines if "forged" in line]
    assert forged
    if log_format == "text":
        assert all("x\\nCRITICAL batchserve forged\\x00" in line for line in forged)


def test_a_small_queue_alone_gives_a_working_server() -> None:
    """BATCHSERVE_QUEUE_CAPACITY=4 and nothing else: max_instances follows it down to 4."""
    with serve("--model", "linear", "--devices", "cpu",
               env={"BATCHSERVE_QUEUE_CAPACITY": "4"}) as (proc, url):
        wait_ready(url)
        r = httpx.post(url + "/predict", json={"instances": [[1, 2, 3, 4]] * 4}, timeout=60)
        assert r.status_code == 200 and len(r.json()["predictions"]) == 4
        r = httpx.post(url + "/predict", json={"instances": [[1, 2, 3, 4]] * 5}, timeout=60)
        assert r.status_code == 413 and "limit of 4" in r.json()["error"]["message"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0


def test_bench_is_not_a_command_of_the_package() -> None:
    proc = run_cli("bench")
    assert proc.returncode == 2 and "invalid choice: 'bench'" in proc.stderr


def test_bad_settings_exit_2_with_a_message() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--max-wait-ms", "5000", "--request-timeout-s", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S, env={**os.environ, **QUIET_ENV},
    )
    assert proc.returncode == 2
    assert "max_wait_ms" in proc.stderr and "request_timeout_s" in proc.stderr


def test_a_model_that_cannot_load_exits_1_without_a_traceback() -> None:
    with serve("--model", "tests.fakes:BrokenLoadHandler", "--devices", "cpu",
               stderr=subprocess.PIPE) as (proc, _url):
        assert proc.wait(WAIT_S) == 1
        err = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "failed to load" in err and "weights are corrupt" in err
    assert "Traceback" not in err


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=WAIT_S, env={**os.environ, **QUIET_ENV})


@pytest.mark.parametrize("frontends", ["1", "2"])
@pytest.mark.parametrize(("args", "says"), [
    (["--fd", "99"], "fd 99: Bad file descriptor; pass a listening socket's descriptor"),
    (["--fd", "2"], "fd 2: Socket operation on non-socket; pass a listening socket's"),
    (["--fd", "{bound}"], "fd {bound} is a socket that is not listening"),
    (["--model-control-mode", "explicit", "--load-model", "linear", "--load-model", "other"],
     "load_model names other: this server serves one model, 'linear'"),
    (["--default-model", "other"],
     "default_model names other: this server serves one model, 'linear'"),
])
def test_a_listener_or_start_up_model_it_cannot_have_is_one_line_and_exit_2(
    frontends: str, args: list[str], says: str
) -> None:
    """An inherited descriptor that is not a listening socket, and a start-up model that is not
    the one model served, are named, where one was a traceback and the other was ignored."""
    with socket.socket() as bound:  # bound, never listening: passed as it is
        bound.bind(("127.0.0.1", 0))
        fd = str(bound.fileno())
        command = [sys.executable, "-m", "app", "serve", "--model", "linear", "--devices", "cpu",
                   "--port", "0", "--frontends", frontends,
                   *(a.format(bound=fd) for a in args)]
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=WAIT_S, env={**os.environ, **QUIET_ENV},
                              pass_fds=(bound.fileno(),))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("batchserve: " + says.format(bound=fd)), lines


def test_a_worker_metrics_port_in_use_is_one_line_and_exit_2() -> None:
    """Checked before the model loads; it was a traceback once the model had."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("worker", "--model", "linear", "--devices", "cpu", "--redis-url",
                       "redis://127.0.0.1:1/0", "--worker-metrics-port", str(port))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"batchserve: cannot serve metrics on 127.0.0.1:{port}: Address already in use"]


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_a_start_up_model_the_repository_lacks_is_one_line_and_exit_2(
        frontends: str, tmp_path: Path) -> None:
    """As Triton refuses to start without a model it was told to load; it was ignored."""
    (tmp_path / "echo").mkdir()
    proc = run_cli("serve", "--model-repository", str(tmp_path), "--model-control-mode",
                   "explicit", "--load-model", "nosuch", "--devices", "cpu", "--port", "0",
                   "--frontends", frontends)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"batchserve: load_model names nosuch: not in the model repository {tmp_path} "
        "(it has echo)"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--model", "nosuch.module:build"], "cannot import 'nosuch.module:build'"),
        (["--model", "tests.fakes:raising_factory"], "raised RuntimeError: no weights here"),
        (["--model", "{txt}.pt"], "is not a TorchScript file"),
        (["--model", "{txt}.pt2"], "is not a torch.export program"),
        (["--model", "{txt}"], "unknown model"),
        (["--model", "missing.pt"], "does not exist"),
        (["--devices", "cuda:7"], "no such CUDA device"),
        (["--devices", "tpu"], "devices"),
        (["--config", "{txt}"], "is not valid TOML"),
        (["--config", "missing.toml"], "cannot read config file"),
    ],
)
def test_start_up_failures_are_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    """Whatever is wrong at start-up, the user reads one line naming it and gets exit code 2."""
    txt = tmp_path / "notes"
    for suffix in ("", ".pt", ".pt2"):
        Path(f"{txt}{suffix}").write_text("not a model = [\n")
    args = [a.format(txt=txt) for a in args]
    model = "linear"
    if args[0] == "--model":  # check-model takes the model as its argument
        model, args = args[1], args[2:]
    for command in (["serve", "--port", "0", "--model", model], ["check-model", model]):
        proc = run_cli(*command, *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("batchserve: ") and says in lines[0], lines


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_a_port_in_use_or_a_host_not_here_is_one_line_and_exit_2(frontends: str) -> None:
    taken = free_socket()
    try:
        port = str(taken.getsockname()[1])
        for host, says in (("127.0.0.1", "Address already in use"),
                           ("192.0.2.1", "Cannot assign requested address")):
            proc = run_cli("serve", "--model", "linear", "--devices", "cpu", "--host", host,
                           "--port", port, "--frontends", frontends)
            assert proc.returncode == 2, proc.stderr
            lines = proc.stderr.strip().splitlines()
            assert lines == [f"batchserve: cannot listen on {host}:{port}: {says}"], lines
    finally:
        taken.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["linear", "--model", "mlp"], "two models: 'linear' and --model 'mlp'"),
        ([], "needs a model"),
    ],
)
def test_check_model_needs_one_model(args: list[str], says: str) -> None:
    proc = run_cli("check-model", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("batchserve: ") and says in lines[0], lines


def test_check_model_checks_a_model_of_a_repository_with_its_config(tmp_path: Path) -> None:
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "config.toml").write_text('model = "linear"\nmax_batch_size = 4\n')
    proc = run_cli("check-model", "--model-repository", str(tmp_path), "small", "--devices", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "model: small on cpu" in proc.stdout
    rows = [line.split()[0] for line in proc.stdout.splitlines()
            if re.fullmatch(r"\s+\d+\s+[\d.]+\s+\d+", line)]
    assert rows == ["1", "2", "4"]  # the model's own max_batch_size
    for args, says in [(["nosuch"], "not in the model repository"),
                       ([], "check-model NAME (a model of the repository)")]:
        proc = run_cli("check-model", "--model-repository", str(tmp_path), *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], lines


def test_check_model_takes_the_model_as_a_flag_too() -> None:
    """``--model`` as ``serve`` takes it (argparse would call it ambiguous otherwise)."""
    proc = run_cli("check-model", "--model", "linear", "--devices", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "output OUTPUT0: FP32 shape [2]" in proc.stdout


def test_check_model_prints_schema_timing_and_outputs() -> None:
    proc = run_cli("check-model", "linear", "--devices", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert '"minItems": 4' in proc.stdout and "batch: 1 items in" in proc.stdout
    assert "output OUTPUT0: FP32 shape [2]" in proc.stdout
    assert "cost on cpu (items per batch, measured):" in proc.stdout
    # The grid is 1, 2, 4 ... 32, and the pick is the row with the most items/s, whichever that
    # was on this run (timings on a loaded machine decide it, not this test).
    rows = [line.split() for line in proc.stdout.splitlines()
            if re.fullmatch(r"\s+\d+\s+[\d.]+\s+\d+", line)]
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8, 16, 32]
    top = max(int(r[2]) for r in rows)
    picked = re.search(r"picks: under load, batches of (\d+) items", proc.stdout)
    assert picked is not None and [picked[1], top] in [[r[0], int(r[2])] for r in rows]


# Runs the rest of its command line with SIGINT at its default: a test run started in the
# background of a script (CI's) inherits it ignored, and Ctrl-C would then do nothing.
SIGINT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def test_ctrl_c_during_check_model_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """Ctrl-C while check-model's load computes with torch: exit 130, as a shell reports, and
    nothing printed (it printed a traceback, then aborted: the load's thread came back from
    torch into a finalizing interpreter)."""
    gate = tmp_path / "gate"
    with subprocess.Popen(
            [sys.executable, "-c", SIGINT_DEFAULT, "-m", "app", "check-model",
             "tests.fakes:TorchUntilGateFile", "--devices", "cpu"], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **QUIET_ENV, "GATE_FILE": str(gate)}) as proc:
        try:
            wait_until_sync(Path(f"{gate}.entered").exists, "the load begun")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            proc.kill()
    assert (proc.returncode, out, err) == (130, "", "")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_sticky_cuda_error_fails_liveness_and_the_device_is_not_used_again() -> None:
    """A device-side assert in one batch: that batch's request gets 500, then the device is
    given up (a new thread on that context would fail too): requests refused at once,
    health unhealthy, ``/v2/health/live`` 503."""
    with serve("--model", "tests.fakes:cuda_fault_module", "--devices", "cuda:0",
               "--frontends", "1") as (_, url):
        wait_ready(url)
        ok = httpx.post(url + "/predict", json={"instances": [[1, 2]]}, timeout=WAIT_S)
        assert ok.json()["predictions"] == [[2.0, 4.0]]
        bad = httpx.post(url + "/predict", json={"instances": [[666, 1]]}, timeout=WAIT_S)
        assert bad.status_code == 500
        wait_until_sync(lambda: httpx.get(url + "/v2/health/live").status_code == 503,
                        "not live")
        assert httpx.get(url + "/health_check").json()["status"] == "unhealthy"
        refused = httpx.post(url + "/predict", json={"instances": [[1, 2]]}, timeout=WAIT_S)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "unhealthy"

