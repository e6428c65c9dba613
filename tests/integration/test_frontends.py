"""``batchserve serve --frontends 2``: two front-end processes and one device process behave as one
server (docs/frontends.md): global admission, one health answer, metrics counted once, load and
unload through any front end, SIGTERM, a killed front end, a killed device process."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import (
    QUIET_ENV,
    ROOT,
    WAIT_S,
    children,
    free_port,
    free_socket,
    metric,
    serve,
    split_server,
    wait_ready,
    wait_until_sync,
)

pytestmark = pytest.mark.slow

GATED = ("--model", "tests.fakes:gate_file_module", "--devices", "cpu", "--frontends", "2")


def fresh_get(url: str, path: str) -> httpx.Response:
    """A GET on a new connection: the kernel may hand it to either front end."""
    with httpx.Client(timeout=10) as client:
        return client.get(url + path)


def raw_status(url: str, target: bytes) -> bytes:
    """The status of a GET of ``target`` sent as it is (an HTTP client would resolve it)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return sock.recv(64).split(b" ")[1]


def post(url: str, instances: list[Any], path: str = "/predict") -> httpx.Response:
    with httpx.Client(timeout=60) as client:
        return client.post(url + path, json={"instances": instances})


def test_admission_is_global_and_every_front_end_gives_one_answer(tmp_path: Path) -> None:
    """queue_capacity 4 holds for the whole server: with the model stalled on one request,
    requests through both front ends fill the queue to 4 items, not 4 per front end, the rest
    are refused at once, and every front end says busy."""
    gate = tmp_path / "gate"
    with split_server(*GATED, "--max-batch-size", "1", "--queue-capacity", "4",
                      env={"GATE_FILE": str(gate)}) as (_, url), ThreadPoolExecutor(16) as pool:
        first = pool.submit(post, url, [[0, 0]])
        # Taken by the device thread before the others come: the queue is then theirs alone
        # (a chunk of rows that came together may else leave a place free once it takes one).
        wait_until_sync(lambda: metric(url, "batchserve_in_flight_requests") == 1
                        and metric(url, "batchserve_queue_depth") == 0,
                        "the first request in the device's hands")
        futures = [first, *(pool.submit(post, url, [[i, i]]) for i in range(1, 16))]
        wait_until_sync(lambda: sum(f.done() for f in futures) >= 11,
                        "the requests past capacity refused")
        refused = [f.result() for f in futures if f.done()]
        assert len(refused) == 11
        assert all(r.status_code == 503 and r.json()["error"]["type"] == "busy"
                   and r.headers["retry-after"] for r in refused)
        assert metric(url, "batchserve_queue_depth") == 4
        health = {fresh_get(url, "/health_check").json()["status"] for _ in range(12)}
        assert health == {"busy"}
        gate.touch()
        answered = [f.result() for f in futures if f.result().status_code == 200]
        assert len(answered) == 5
        assert all(r.json()["predictions"][0][0] % 2 == 0 for r in answered)
        health = {fresh_get(url, "/health_check").json()["status"] for _ in range(12)}
        assert health == {"ready"}


@pytest.mark.parametrize("frontends", [1, 2])
def test_a_request_whose_client_left_while_queued_is_dropped_not_computed(
        tmp_path: Path, frontends: int) -> None:
    """With the model stalled on one request, a second one's client gives up and leaves: the
    server counts it 499, and its item is dropped from the one queue, not computed, whichever
    front end took it."""
    gate = tmp_path / "gate"
    args = (*GATED[:-1], str(frontends), "--max-batch-size", "1")
    with (split_server if frontends > 1 else serve)(*args, env={"GATE_FILE": str(gate)}) as (
            _, url), ThreadPoolExecutor(1) as pool:
        wait_ready(url)
        busy = pool.submit(post, url, [[1, 1]])
        wait_until_sync(lambda: metric(url, "batchserve_in_flight_requests") == 1
                        and metric(url, "batchserve_queue_depth") == 0,
                        "the first request in the device's hands")
        host, port = url.removeprefix("http://").rsplit(":", 1)
        body = b'{"instances": [[2, 2]]}'
        with socket.create_connection((host, int(port)), timeout=10) as leaver:
            leaver.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
            wait_until_sync(lambda: metric(url, "batchserve_queue_depth") == 1, "it queued")
        wait_until_sync(lambda: metric(url, "batchserve_requests_total", status="499") == 1,
                        "the leaver counted")
        gate.touch()
        assert busy.result().json()["predictions"] == [[2.0, 2.0]]
        wait_until_sync(lambda: metric(url, "batchserve_dropped_items_total",
                                       reason="cancelled") == 1, "its item dropped")
        assert metric(url, "batchserve_batch_size_sum") == 1  # the first one's item alone
        assert metric(url, "batchserve_in_flight_requests") == 0


def test_answers_from_the_device_process_carry_one_date_and_head_keeps_the_connection() -> None:
    """What a front end passes on from the device process (health, metadata) has the front
    end's Date and Server only, and a HEAD check answers a GET's length with no body, so the
    next request on the connection is read as one."""
    with split_server("--model", "linear", "--devices", "cpu", "--frontends", "2") as (_, url):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"HEAD /health_check HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"GET /health_check HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    get, body = rest.split(b"\r\n\r\n", 1)
    for answer in (head, get):
        lines = answer.lower().split(b"\r\n")
        assert lines[0].endswith(b"200 ok"), answer
        assert [ln.split(b":")[0] for ln in lines[1:]].count(b"date") == 1, answer
        assert [ln.split(b":")[0] for ln in lines[1:]].count(b"server") == 1, answer
    length = int(dict(ln.split(b": ", 1) for ln in get.lower().split(b"\r\n")[1:])[
        b"content-length"])
    assert b"content-length: %d" % length in head.lower()
    assert len(body) == length and b'"status":"ready"' in body


def listening_unix_sockets(pid: int) -> list[str]:
    """The listening Unix sockets process ``pid`` holds, by their /proc/net/unix lines."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    lines = Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]
    # Fields: Num RefCount Protocol Flags Type St Inode Path; flag 0x10000: listening.
    return [line for line, fields in ((line, line.split()) for line in lines)
            if fields[6] in inodes and int(fields[3], 16) & 0x10000]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_process_of_the_server_listens_on_a_unix_socket() -> None:
    """The front ends reach the device process's app over their links alone (app/asks.py):
    no other process can reach it by a Unix socket, an abstract name included."""
    with split_server("--model", "linear", "--devices", "cpu", "--frontends", "2") as (
            proc, url):
        assert fresh_get(url, "/v2").status_code == 200  # asked of its app, over a link
        for pid in (proc.pid, *children(proc.pid)):
            assert listening_unix_sockets(pid) == [], pid


JSON = {"content-type": "application/json"}
TENSOR = (b'{"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", '
          b'"data": [1, 2, 3, 4]}]')
SAME_ANSWERS = [  # (method, path, headers, body): what two front ends must answer as one process
    ("GET", "/health_check?model=nope", {}, None), ("GET", "/health_check/", {}, None),
    ("HEAD", "/health_check", {}, None), ("GET", "/v2", {}, None),
    ("HEAD", "/v2/models/linear", {}, None), ("TRACE", "/v2/models/linear", {}, None),
    ("PROPFIND", "/nope", {}, None),
    ("GET", "/v2/health/ready", {}, None), ("GET", "/v2/models/linear/config", {}, None),
    ("GET", "/v2/models/linear/versions/2", {}, None), ("POST", "/v2/repository/index", {}, b""),
    ("POST", "/v2/repository/models/linear/load", {}, b""), ("DELETE", "/v2/models/linear", {},
                                                            None),
    ("GET", "/predict", {}, None), ("GET", "/nope%2F..%2Fx", {}, None),
    ("POST", "/predict", JSON, b'{"instances": [[1, 2, 3, 4]]}'),
    ("POST", "/predict", JSON, b'{"instances": [[1, 2, 3]]}'),
    ("POST", "/predict", {**JSON, "x-priority": "9"}, b'{"instances": [[1, 2, 3, 4]]}'),
    ("POST", "/predict", {"content-encoding": "br"}, b"{}"),
    ("POST", "/models/nope/predict", JSON, b'{"instances": [[1, 2, 3, 4]]}'),
    ("POST", "/v2/models/linear/infer", JSON, TENSOR + b"}"),
    ("POST", "/v2/models/linear/infer", JSON, TENSOR + b', "outputs": [{"name": "OUTPUT0", '
                                                       b'"parameters": {"binary_data": true}}]}'),
    ("POST", "/v2/models/linear/infer", JSON, TENSOR + b', "parameters": {"priority": 9}}'),
    ("POST", "/v2/models/linear/infer", {"inference-header-content-length": "-1"}, b"{}"),
]


def test_every_answer_is_the_one_a_single_process_gives() -> None:
    """Status, headers and body, through two front ends and from one process alike (their own
    Date and request id aside): what a front end answers itself and what
    it passes on from the device process. Neither front end has torch loaded."""
    linear = ("--model", "linear", "--devices", "cpu")
    answers: list[list[tuple[int, list[tuple[str, str]], bytes]]] = []
    for frontends in ("1", "2"):
        with (split_server if frontends == "2" else serve)(*linear, "--frontends", frontends
                                                            ) as (proc, url):
            wait_ready(url)
            with httpx.Client(base_url=url, timeout=10) as client:
                answers.append([_answer(client.request(method, path, headers=headers,
                                                       content=body))
                                for method, path, headers, body in SAME_ANSWERS])
            assert torch_loaded(proc.pid)
            assert not any(torch_loaded(pid) for pid in children(proc.pid))
    for case, one, two in zip(SAME_ANSWERS, *answers, strict=True):
        assert one == two, case


def test_sentences_of_every_length_are_answered_as_one_process_answers() -> None:
    """minilm's sentences of many lengths, sent in one burst: through two front ends a
    message's sentences are one chunk in the device process, batched by length row by row and
    answered as they are computed (docs/frontends.md; tests/unit/test_bridge.py checks the
    chunks); each answer is the one a single process gives. The front ends tokenize without
    torch."""
    sentences = [" ".join(["word"] * n) for n in (1, 3, 7, 15, 31, 2, 60, 120)] * 6

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*[client.post("/predict", json={"instances": [s]})
                                          for s in sentences])

    embeddings = []
    for frontends in ("1", "2"):
        with (split_server if frontends == "2" else serve)(
                "--model", "minilm", "--devices", "cpu", "--frontends", frontends) as (proc, url):
            wait_ready(url)
            answers = asyncio.run(burst(url))
            assert [a.status_code for a in answers] == [200] * len(sentences)
            embeddings.append(np.array([a.json()["predictions"][0] for a in answers]))
            assert not any(torch_loaded(pid) for pid in children(proc.pid))
    assert embeddings[0].shape == (len(sentences), 384)
    np.testing.assert_allclose(embeddings[1], embeddings[0], atol=1e-4)


def torch_loaded(pid: int) -> bool:
    """Whether process ``pid`` has torch's library mapped. A front end never should: it decodes
    (tokenizes) with the handlers the device process sends it, which hold no module."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def _answer(response: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = sorted((k.lower(), v) for k, v in response.headers.multi_items()
                     if k.lower() not in ("date", "x-request-id"))
    return response.status_code, headers, response.content


def test_metrics_count_each_request_once_and_errors_match_one_process() -> None:
    with split_server("--model", "linear", "--devices", "cpu", "--frontends", "2") as (_, url):
        for i in range(10):
            r = post(url, [[i, 1, 2, 3]])
            assert r.status_code == 200 and len(r.json()["predictions"][0]) == 2
        bad = post(url, [[1, 2]])
        assert bad.status_code == 422 and "expected shape" in bad.json()["error"]["message"]
        v2 = httpx.post(url + "/v2/models/linear/infer", timeout=10, json={"inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        assert v2.status_code == 200 and v2.json()["outputs"][0]["shape"] == [1, 2]
        missing = post(url, [[1, 2, 3, 4]], "/models/nope/predict")
        assert missing.status_code == 404 and "unknown model 'nope'" in missing.text
        # Triton's statistics, through either front end, read at once: every request answered,
        # once (the front ends send the counts they hold first, as for a scrape).
        stats = fresh_get(url, "/v2/models/linear/stats").json()["model_stats"]
        assert [(s["name"], s["version"]) for s in stats] == [("linear", "1")]
        figures = stats[0]["inference_stats"]
        assert (figures["success"]["count"], figures["fail"]["count"]) == (11, 1)
        assert figures["queue"]["count"] == figures["compute_infer"]["count"] == 11
        assert stats[0]["inference_count"] == 11
        assert metric(url, "batchserve_requests_total", status="200") == 11
        assert metric(url, "batchserve_requests_total", status="422") == 1
        assert metric(url, "batchserve_requests_total", status="404") == 1
        # Sent one at a time, the 11 computed came in 11 messages at least (counts and
        # acknowledgements travel too).
        assert metric(url, "batchserve_frontend_messages_total") >= 11
        metadata = fresh_get(url, "/v2/models/linear")
        assert metadata.status_code == 200 and metadata.json()["name"] == "linear"
        for path in ("/v2/models/a%0Ab", "/v2/models/%C2%A8%19/ready"):  # as one process answers
            unknown = fresh_get(url, path)
            assert unknown.status_code == 404 and "unknown model" in unknown.json()["error"]
        assert raw_status(url, b"/v2/../metrics") == b"404"  # routed as sent, not resolved


def test_a_request_past_its_deadline_is_answered_504_and_never_computed(tmp_path: Path) -> None:
    """The front end keeps each request's deadline: with the model stalled, a request with a
    short X-Request-Timeout is answered 504 on time, and the device process drops its item."""
    gate = tmp_path / "gate"
    with split_server(*GATED, "--max-batch-size", "1", env={"GATE_FILE": str(gate)}) as (_, url), \
            ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, url, [[2, 2]])
        wait_until_sync(lambda: metric(url, "batchserve_queue_depth") == 0
                        and metric(url, "batchserve_in_flight_requests") == 1, "the model busy")
        with httpx.Client(timeout=60) as client:
            late = client.post(url + "/predict", json={"instances": [[4, 4]]},
                               headers={"X-Request-Timeout": "0.3"})
        assert late.status_code == 504 and late.json()["error"]["type"] == "timeout"
        gate.touch()
        assert first.result().json()["predictions"] == [[4.0, 4.0]]
        wait_until_sync(lambda: metric(url, "batchserve_dropped_items_total",
                                       reason="expired") == 1, "the late item dropped")
        assert metric(url, "batchserve_requests_total", status="504") == 1
        assert metric(url, "batchserve_batch_size_count") == 1  # only the first was computed


def test_a_stuck_device_thread_fails_liveness_through_every_front_end(tmp_path: Path) -> None:
    """The model's call past ``device_timeout_s``: ``/v2/health/live`` 503 and health
    unhealthy from either front end; both back once the call returns."""
    gate = tmp_path / "gate"
    with split_server(*GATED, "--device-timeout-s", "1", env={"GATE_FILE": str(gate)}) as (
            _, url), ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, url, [[2, 2]])
        wait_until_sync(lambda: fresh_get(url, "/v2/health/live").status_code == 503, "stuck")
        answers = [fresh_get(url, "/v2/health/live") for _ in range(8)]
        assert {(a.status_code, a.content) for a in answers} == {(503, b'{"live":false}')}
        assert {fresh_get(url, "/health_check").json()["status"] for _ in range(8)} == {
            "unhealthy"}
        assert metric(url, "batchserve_device_up") == 0
        gate.touch()
        assert first.result().json()["predictions"] == [[4.0, 4.0]]
        wait_until_sync(lambda: fresh_get(url, "/v2/health/live").status_code == 200, "going on")
        assert {fresh_get(url, "/v2/health/live").status_code for _ in range(8)} == {200}


def test_load_and_unload_through_any_front_end_act_on_the_one_repository(
        tmp_path: Path) -> None:
    for name, model in (("lin", "linear"), ("other", "linear")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(f'model = "{model}"\n')
    with split_server("--model-repository", str(tmp_path), "--devices", "cpu",
                      "--model-control-mode", "explicit", "--load-model", "lin",
                      "--frontends", "2") as (_, url):
        assert post(url, [[1, 2, 3, 4]], "/models/other/predict").status_code == 404
        with httpx.Client(timeout=60) as client:  # one connection: one front end
            assert client.post(url + "/v2/repository/models/other/load").status_code == 200
            r = client.post(url + "/models/other/predict", json={"instances": [[1, 2, 3, 4]]})
            assert r.status_code == 200
        for _ in range(6):  # and every front end knows it
            assert post(url, [[1, 2, 3, 4]], "/models/other/predict").status_code == 200
        with httpx.Client(timeout=60) as client:
            assert client.post(url + "/v2/repository/models/other/unload").status_code == 200
            r = client.post(url + "/models/other/predict", json={"instances": [[1, 2, 3, 4]]})
            assert r.status_code == 404
        index = httpx.post(url + "/v2/repository/index", timeout=10).json()
        assert {m["name"]: m.get("state") for m in index} == {"lin": "READY",
                                                                "other": "UNAVAILABLE"}


@contextmanager
def lin_and_slow(repo: Path, slow: str, frontends: int
                 ) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ready server of ``lin`` (linear) with ``frontends`` front ends, whose repository
    (``repo``) also has ``slow`` (the model setting ``slow``), gated by ``repo``/gate."""
    for name, spec in (("lin", "linear"), ("slow", slow)):
        (repo / name).mkdir()
        (repo / name / "config.toml").write_text(f'model = "{spec}"\n')
    with (split_server if frontends > 1 else serve)(
            "--model-repository", str(repo), "--devices", "cpu", "--model-control-mode",
            "explicit", "--load-model", "lin", "--frontends", str(frontends),
            env={"GATE_FILE": str(repo / "gate")}) as (proc, url):
        wait_ready(url)
        yield proc, url


@pytest.mark.parametrize("frontends", [1, 2])
def test_a_model_whose_code_builds_slowly_leaves_the_server_serving(tmp_path: Path,
                                                                     frontends: int) -> None:
    """While a loaded model's factory runs (off the device process's event loop), every front
    end answers health, serves the other model and says the new one is loading."""
    gate = tmp_path / "gate"
    with lin_and_slow(tmp_path, "tests.fakes:gate_file_build", frontends) as (_, url), \
            ThreadPoolExecutor(1) as pool:
        load = pool.submit(httpx.post, url + "/v2/repository/models/slow/load", timeout=120)
        wait_until_sync(lambda: post(url, [[1, 2]], "/models/slow/predict").status_code == 503,
                        "the load begun")
        for _ in range(6):
            r = post(url, [[1, 2]], "/models/slow/predict")
            assert r.status_code == 503 and r.json()["error"]["type"] == "loading"
            assert fresh_get(url, "/health_check").json()["status"] == "ready"
            assert post(url, [[1, 2, 3, 4]], "/models/lin/predict").status_code == 200
        assert not gate.exists() and not load.done()  # all that while the factory waited
        gate.touch()
        assert load.result().status_code == 200
        assert post(url, [[1, 2]], "/models/slow/predict").json()["predictions"] == [[2.0, 4.0]]


def test_a_handler_slow_to_build_in_the_front_ends_leaves_them_serving(tmp_path: Path) -> None:
    """A front end builds the handler of a model the device process sends none for (a user's
    ``ModelHandler``) off its event loop: while that takes long, it answers health, serves the
    other model and says the new one is loading; the load is answered once the front ends
    serve it or after its limit (app/bridge.py's SYNC_LIMIT_S), and the model is served once
    built."""
    gate = tmp_path / "gate"
    with lin_and_slow(tmp_path, "tests.fakes:GateFileInFrontEnds", 2) as (_, url):
        load = httpx.post(url + "/v2/repository/models/slow/load", timeout=WAIT_S)
        assert load.status_code == 200
        for _ in range(6):
            assert fresh_get(url, "/health_check").json()["status"] == "ready"
            assert fresh_get(url, "/health_check?model=slow").json()["status"] == "loading"
            assert fresh_get(url, "/v2/models/slow/ready").status_code == 503
            assert post(url, [[1, 2, 3, 4]], "/models/lin/predict").status_code == 200
            r = post(url, [1], "/models/slow/predict")
            assert r.status_code == 503 and r.json()["error"]["type"] == "loading", r.text
        gate.touch()
        wait_until_sync(lambda: all(post(url, [1], "/models/slow/predict").status_code == 200
                                    for _ in range(6)), "both front ends serve it")
        assert post(url, [1], "/models/slow/predict").json()["predictions"] == [2.0]
        assert fresh_get(url, "/health_check?model=slow").json()["status"] == "ready"


def test_front_ends_whose_handler_never_builds_start_and_say_it_loads(tmp_path: Path) -> None:
    """A front end waits at its start for the handlers of the models served (so it serves them
    from its first request) for a few seconds at most: one that never builds there (its module
    hangs on import) leaves the front end answering, the model 503 ``loading`` there, and the
    server's health says loading (whichever front end answers) till every front end serves
    it: a gateway sends it nothing it cannot serve."""
    gate = tmp_path / "gate"
    with serve("--model", "tests.fakes:GateFileInFrontEnds", "--devices", "cpu",
               "--frontends", "2", env={"GATE_FILE": str(gate)}, reuse_port=True) as (_, url):
        def answering() -> bool:
            """A front end takes its first connections once its start is over: 5 s of waiting
            for the handler after its process starts, more than fresh_get's 10 s on a busy
            machine."""
            try:
                return (fresh_get(url, "/health_check").status_code == 503
                        and metric(url, "batchserve_frontends_connected") == 2)
            except httpx.TimeoutException:
                return False

        wait_until_sync(answering, "both front ends answering")
        for _ in range(6):
            r = post(url, [1])
            assert r.status_code == 503 and r.json()["error"]["type"] == "loading", r.text
            health = fresh_get(url, "/health_check")
            assert health.status_code == 503 and health.json()["status"] == "loading"
            assert health.json()["models"][0]["status"] == "loading"
            assert fresh_get(url, "/v2/health/ready").status_code == 503
        gate.touch()
        wait_ready(url)
        assert all(post(url, [1]).status_code == 200 for _ in range(6))
        assert {fresh_get(url, "/health_check").json()["status"] for _ in range(6)} == {"ready"}


def test_the_first_ready_health_answer_finds_every_front_end_serving(tmp_path: Path) -> None:
    """Front ends that started while the start-up load ran (the model's code still building)
    learn of the model by snapshot: the server reads loading till each holds it, with its
    handler (app/bridge.py, ``_end_start``), so requests sent the moment a probe first reads
    ready (a gateway's, Kubernetes' readiness) are answered by every front end, none refused
    as loading."""
    gate, log = tmp_path / "gate", tmp_path / "server.log"
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "config.toml").write_text('model = "tests.fakes:gate_file_build"\n')
    with log.open("wb") as out, serve(
            "--model-repository", str(tmp_path), "--devices", "cpu", "--model-control-mode",
            "explicit", "--load-model", "slow", "--frontends", "2",
            env={"GATE_FILE": str(gate)}, stderr=out.fileno(), reuse_port=True) as (_, url):
        wait_until_sync(lambda: len(re.findall(r"front end \d+: ready in ", log.read_text()))
                        == 2, "both front ends started")
        assert fresh_get(url, "/health_check").json()["status"] == "loading"
        gate.touch()

        async def at_first_ready() -> list[int]:
            async with httpx.AsyncClient(timeout=WAIT_S) as probe, \
                    httpx.AsyncClient(timeout=WAIT_S) as client:
                while (await probe.get(url + "/health_check")).status_code != 200:
                    await asyncio.sleep(0.002)
                # at once, on connections of their own, which the kernel spreads
                answers = await asyncio.gather(*(
                    client.post(url + "/predict", json={"instances": [[1, 2]]})
                    for _ in range(16)))
            return [answer.status_code for answer in answers]

        assert asyncio.run(at_first_ready()) == [200] * 16


@pytest.mark.parametrize("frontends", [1, 2])
def test_each_process_refreezes_its_heap_after_a_load_and_an_unload(tmp_path: Path,
                                                                   frontends: int) -> None:
    """A model loaded once the server is up leaves its objects out of the collector's reach,
    as those alive at start-up are (app/process.py), and its unload has its garbage collected:
    in the device process (or the one process), and in each front end that builds the model's
    handler: one of its own (tests.fakes' EchoHandler), where the device process sends none."""
    for name, spec in (("lin", "linear"), ("other", "tests.fakes:EchoHandler")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(f'model = "{spec}"\n')
    log = tmp_path / "server.log"
    args = ("--model-repository", str(tmp_path), "--devices", "cpu", "--model-control-mode",
            "explicit", "--load-model", "lin", "--frontends", str(frontends),
            "--log-level", "debug")

    def lines(pattern: str) -> int:
        return len(re.findall(pattern, log.read_text()))

    with log.open("wb") as out, (split_server if frontends > 1 else serve)(
            *args, stderr=out.fileno()) as (_, url):
        wait_ready(url)
        # every process has frozen its start-up objects (logged as it says it is ready)
        processes = 1 + (frontends if frontends > 1 else 0)
        wait_until_sync(lambda: lines(" ready in ") == processes, "each start-up freeze")
        assert lines(r"objects frozen") == 0  # lin loaded before: nothing to do again
        with httpx.Client(timeout=60) as client:
            assert client.post(url + "/v2/repository/models/other/load").status_code == 200
        wait_until_sync(lambda: lines(r"after model other version 1's load on cpu: \d+ "
                                      "objects frozen") == 1, "the load's freeze")
        if frontends > 1:
            wait_until_sync(lambda: lines(r"after model other's handler: \d+ objects frozen")
                            == frontends, "each front end's freeze")
        with httpx.Client(timeout=60) as client:
            assert client.post(url + "/v2/repository/models/other/unload").status_code == 200
        wait_until_sync(lambda: lines(r"after model other version 1's unload: \d+ objects "
                                      "frozen") == 1, "the unload's freeze")


@pytest.mark.parametrize("how", ["descriptors 0 to 2 closed", "listening on descriptor 0"])
def test_a_server_started_without_standard_descriptors_serves_from_every_front_end(
        how: str) -> None:
    """Started with descriptors 0, 1 and 2 closed (``<&- >&- 2>&-``), or with its listening
    socket as descriptor 0 (``--fd 0``, inetd's way): both front ends serve and SIGTERM exits
    0. A front end's settings come on its descriptor 0: where its listening socket had that
    number (the socket passed in, or the first one the device process made), the front end
    could not start and was started again, forever."""
    sock = free_socket(reuse_port=True)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    command = [sys.executable, "-m", "app", "serve", "--model", "linear", "--devices", "cpu",
               "--frontends", "2"]
    if how == "listening on descriptor 0":
        proc = subprocess.Popen([*command, "--fd", "0"], cwd=ROOT, stdin=sock,
                                env={**os.environ, **QUIET_ENV})
    else:
        proc = subprocess.Popen(["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh", *command, "--fd",
                                 str(sock.fileno())], cwd=ROOT, pass_fds=[sock.fileno()],
                                env={**os.environ, **QUIET_ENV})
    sock.close()
    try:
        wait_ready(url)
        wait_until_sync(lambda: metric(url, "batchserve_frontends_connected") == 2,
                        "two front ends linked")
        assert {post(url, [[1, 2, 3, 4]]).status_code for _ in range(8)} == {200}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
    finally:
        proc.kill()
        proc.wait(WAIT_S)


@pytest.mark.parametrize("group", [False, True])
def test_sigterm_answers_everything_accepted_then_exits_0(tmp_path: Path, group: bool) -> None:
    """SIGTERM to the device process, or to every process of the server at once (``group``:
    Ctrl-C in a terminal, systemd's default KillMode): new requests are refused 503 while the
    accepted ones are answered. A front end that had its own signal and then the device
    process's took the second for the end of its drain, and closed its port."""
    gate = tmp_path / "gate"
    with split_server(*GATED, "--max-batch-size", "2", env={"GATE_FILE": str(gate)}
                      ) as (proc, url), ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(post, url, [[i, i]]) for i in range(6)]
        wait_until_sync(lambda: metric(url, "batchserve_in_flight_requests") == 6,
                        "6 requests in flight")
        fronts = children(proc.pid)
        if group:
            os.killpg(proc.pid, signal.SIGTERM)  # serve() starts it in a session of its own
        else:
            proc.send_signal(signal.SIGTERM)
        wait_until_sync(lambda: fresh_get(url, "/health_check").json()["status"] == "draining",
                        "draining")
        # Twenty new connections in turn, by when each front end has had every signal sent.
        statuses = [fresh_get(url, "/health_check").json()["status"] for _ in range(20)]
        assert statuses == ["draining"] * 20
        late = post(url, [[9, 9]])
        assert late.status_code == 503 and late.json()["error"]["type"] == "draining"
        gate.touch()
        responses = [f.result() for f in futures]
        assert [r.status_code for r in responses] == [200] * 6
        assert [r.json()["predictions"] for r in responses] == [[[2 * i, 2 * i]] for i in
                                                                range(6)]
        assert proc.wait(WAIT_S) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in fronts)


@pytest.mark.parametrize("frontends", [1, 2])
@pytest.mark.parametrize("model", ["tests.fakes:gate_file_build", "tests.fakes:GateFileLoad",
                                   "tests.fakes:TorchUntilGateFile"])
def test_sigterm_during_a_load_that_never_ends_answers_it_and_exits_0(
        tmp_path: Path, model: str, frontends: int) -> None:
    """A load whose model code (its factory, or its replica's load, asleep or computing with
    torch) never returns: SIGTERM answers the load 503 draining at once and the server exits 0
    (it waited on the load's thread for good, and the exit aborted where that thread was
    inside torch)."""
    with lin_and_slow(tmp_path, model, frontends) as (proc, url), ThreadPoolExecutor(1) as pool:
        load = pool.submit(httpx.post, url + "/v2/repository/models/slow/load", timeout=WAIT_S)

        def loading() -> bool:
            index = httpx.post(url + "/v2/repository/index", timeout=10).json()
            return {"name": "slow", "state": "LOADING"}.items() <= index[-1].items()

        wait_until_sync(loading, "the load begun")
        proc.send_signal(signal.SIGTERM)
        answer = load.result()
        assert answer.status_code == 503
        assert answer.json() == {"error": "the server is shutting down: the load of 'slow' "
                                          "was abandoned"}
        assert proc.wait(WAIT_S) == 0


@pytest.mark.parametrize("frontends", [1, 2])
def test_a_decode_that_never_returns_is_answered_at_its_deadline_and_exits_no_process(
        tmp_path: Path, frontends: int) -> None:
    """A model's decode stuck on a request's input: the request is answered 504 at its
    deadline, the server serves on, and SIGTERM, with the decode still stuck, exits 0 (the
    decode pool's threads held the process once: the interpreter joins them at exit)."""
    with (split_server if frontends > 1 else serve)(
            "--model", "tests.fakes:GateFileDecode", "--devices", "cpu", "--frontends",
            str(frontends), env={"GATE_FILE": str(tmp_path / "never")}) as (proc, url):
        wait_ready(url)
        stuck = httpx.post(url + "/predict", json={"instances": [-1]}, timeout=WAIT_S,
                           headers={"X-Request-Timeout": "1"})
        assert stuck.status_code == 504, stuck.text
        assert stuck.json()["error"]["type"] == "timeout"
        assert post(url, [3]).json()["predictions"] == [6]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0


def test_new_connections_while_draining_are_answered_not_held(tmp_path: Path) -> None:
    """Draining, a front end with nothing in flight exits at once, the other answers new
    requests 503 till its own are done. The device process kept the first one's listening
    socket open, which went on taking a share of new connections that nobody accepted: they
    hung till their clients gave up (one in two here)."""
    gate = tmp_path / "gate"
    with split_server(*GATED, env={"GATE_FILE": str(gate)}) as (proc, url), \
            ThreadPoolExecutor(1) as pool, httpx.Client(base_url=url, timeout=60) as held:
        port = int(url.rsplit(":", 1)[1])
        fronts = children(proc.pid)
        assert held.get("/health_check").status_code == 200  # its connection: one front end's
        busy = [pid for pid in fronts if established(pid, port)]
        assert len(busy) == 1, busy
        idle = [pid for pid in fronts if pid not in busy]
        answer = pool.submit(held.post, "/predict", json={"instances": [[1, 1]]})
        wait_until_sync(lambda: metric(url, "batchserve_in_flight_requests") == 1, "in flight")
        proc.send_signal(signal.SIGTERM)
        wait_until_sync(lambda: not any(Path(f"/proc/{pid}").exists() for pid in idle),
                        "the idle front end gone")
        for _ in range(16):  # each on a new connection, which the kernel may hand to any socket
            late = httpx.get(url + "/health_check", timeout=30)
            assert late.status_code == 503 and late.json()["status"] == "draining"
        gate.touch()
        assert answer.result().json()["predictions"] == [[2, 2]]
        assert proc.wait(WAIT_S) == 0


def test_each_request_has_one_access_line_under_its_id() -> None:
    """A request a front end hands to the device process (metadata, the repository, health) is
    logged once, by the front end that took it, as inference is."""
    with split_server("--model", "linear", "--devices", "cpu", "--frontends", "2",
                      stderr=subprocess.PIPE) as (proc, url), httpx.Client(timeout=10) as client:
        calls = {
            "infer-1": lambda h: client.post(url + "/predict", headers=h,
                                             json={"instances": [[1, 2, 3, 4]]}),
            "metadata-1": lambda h: client.get(url + "/v2/models/linear", headers=h),
            "index-1": lambda h: client.post(url + "/v2/repository/index", headers=h),
            "unknown-1": lambda h: client.get(url + "/v2/models/nope", headers=h),
        }
        statuses = {rid: call({"X-Request-ID": rid}).status_code for rid, call in calls.items()}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
        assert proc.stderr is not None
        lines = proc.stderr.read().decode().splitlines()
    assert statuses == {"infer-1": 200, "metadata-1": 200, "index-1": 200, "unknown-1": 404}
    for rid in calls:
        access = [line for line in lines if f"batchserve.access [{rid}]" in line]
        assert len(access) == 1, access
        assert "127.0.0.1" in access[0]  # the front end's line: it knows the client


def established(pid: int, port: int) -> int:
    """The connections to ``port`` that process ``pid`` holds open (its accepted ones)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                inodes.add(fields[9])
    links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    return sum(link.removeprefix("socket:[").removesuffix("]") in inodes for link in links)


def test_new_connections_are_spread_over_the_front_ends() -> None:
    """Each front end has its own socket in a SO_REUSEPORT group (app/listening.py): 32
    connections opened one after another all reach a front end, at least 4 each (the kernel
    picks by address; fewer than 4 of 32 happens about once in a million runs). One shared
    socket left it to whichever woke first: one front end took 144 of 256, another 13."""
    with split_server("--model", "linear", "--devices", "cpu", "--frontends", "2"
                      ) as (proc, url):
        port = int(url.rsplit(":", 1)[1])
        clients = [httpx.Client(base_url=url, timeout=10) for _ in range(32)]
        try:
            assert all(c.get("/health_check").status_code == 200 for c in clients)
            counts = [established(pid, port) for pid in children(proc.pid)]
        finally:
            for client in clients:
                client.close()
        assert sum(counts) == 32 and min(counts) >= 4, counts


@pytest.mark.parametrize("shared", [False, True], ids=["own-sockets", "one-socket"])
def test_a_killed_front_end_is_replaced_and_the_other_serves_on(shared: bool) -> None:
    """Every request on a new connection is answered: with a socket each, those the kernel
    gives the killed one's wait in it for its replacement, which takes that socket over."""
    with split_server("--model", "linear", "--devices", "cpu", "--frontends", "2",
                      shared=shared) as (proc, url):
        first, second = children(proc.pid)
        os.kill(first, signal.SIGKILL)
        for _ in range(10):
            assert post(url, [[1, 2, 3, 4]]).status_code == 200
        wait_until_sync(lambda: len(children(proc.pid)) == 2 and first not in children(proc.pid),
                        "a new front end")
        wait_until_sync(lambda: metric(url, "batchserve_frontends_connected") == 2,
                        "the new front end linked")
        assert metric(url, "batchserve_frontend_restarts_total") == 1
        assert second in children(proc.pid)
        for _ in range(10):
            assert post(url, [[1, 2, 3, 4]]).status_code == 200


def test_a_hung_front_end_is_killed_and_replaced() -> None:
    """A front end whose event loop answers nothing (stopped with SIGSTOP) is killed once it
    has been silent for ``frontend_timeout_s``, and replaced; the server serves on."""
    with split_server("--model", "linear", "--devices", "cpu", "--frontends", "2",
                      "--frontend-timeout-s", "3", stderr=subprocess.PIPE) as (proc, url):
        first = children(proc.pid)[0]
        os.kill(first, signal.SIGSTOP)
        wait_until_sync(lambda: len(children(proc.pid)) == 2 and first not in children(proc.pid),
                        "the hung front end replaced")
        wait_until_sync(lambda: metric(url, "batchserve_frontends_connected") == 2,
                        "the new front end linked")
        assert metric(url, "batchserve_frontend_restarts_total") >= 1
        for _ in range(10):
            assert post(url, [[1, 2, 3, 4]]).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
        assert proc.stderr is not None
        log = proc.stderr.read().decode()
    assert re.search(rf"\(pid {first}\) has not answered for \d+s; killing it", log), log[-2000:]


NO_SECOND_FORK = """
import errno, subprocess
started = []
class NoFork(subprocess.Popen):
    def __init__(self, args, *rest, **kwargs):
        if "app.frontend.entry" in args:
            started.append(args)
            if len(started) == 2:
                raise OSError(errno.EAGAIN, "fork")
        super().__init__(args, *rest, **kwargs)
subprocess.Popen = NoFork
"""


def test_front_ends_that_cannot_be_started_end_the_start_in_one_line(tmp_path: Path) -> None:
    """No process for the second front end (a pids or memory limit, made here by a
    sitecustomize): one critical line, the first front end stopped, exit 1, no traceback."""
    (tmp_path / "sitecustomize.py").write_text(NO_SECOND_FORK)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--model", "linear", "--devices", "cpu",
         "--frontends", "2", "--port", "0"], cwd=ROOT, capture_output=True, text=True,
        timeout=WAIT_S, env={**os.environ, **QUIET_ENV, "PYTHONPATH": path})
    assert proc.returncode == 1, proc.stderr
    assert "CRITICAL batchserve [None]: cannot start the front ends: " in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert front_ends_with(str(tmp_path)) == []  # the first one stopped, not orphaned


def front_ends_with(marker: str) -> list[int]:
    """The running front ends whose environment holds ``marker``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and b"app.frontend.entry" in (proc / "cmdline").read_bytes()
                    and marker.encode() in (proc / "environ").read_bytes()):
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def test_a_held_device_process_is_unhealthy_within_seconds_through_the_front_ends() -> None:
    """The device process's event loop held (here: stopped): a health check through a front
    end, over HTTP or gRPC, is answered unhealthy after HEALTH_TIMEOUT_S, not held until its
    client gives up; the same once the process goes on is ready. The checks are asked at once,
    each from a client of its own."""
    import grpc
    import tritonclient.grpc as triton
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from app.api.relay import HEALTH_TIMEOUT_S, held

    def http(path: str) -> None:
        with httpx.Client(timeout=HEALTH_TIMEOUT_S + 30) as client:
            answer = client.get(url + path)
        assert answer.status_code == 503, path
        assert answer.json() == {"status": "unhealthy", "reason": held(HEALTH_TIMEOUT_S)}

    def v2(ask: str) -> None:
        assert not getattr(triton.InferenceServerClient(f"127.0.0.1:{port}"), ask)(), ask

    def grpc_health() -> None:
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        status = health.Check(health_pb2.HealthCheckRequest(service=""),
                              timeout=HEALTH_TIMEOUT_S + 30).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING

    port = free_port()
    with split_server("--model", "linear", "--devices", "cpu", "--frontends", "2",
                      "--grpc-port", str(port)) as (proc, url), ThreadPoolExecutor(6) as pool:
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            checks = [pool.submit(http, path)
                      for path in ("/health_check", "/v2/health/live", "/v2/health/ready")]
            checks += [pool.submit(v2, ask) for ask in ("is_server_live", "is_server_ready")]
            checks.append(pool.submit(grpc_health))
            for check in checks:
                check.result()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert fresh_get(url, "/health_check").json()["status"] == "ready"
        assert triton.InferenceServerClient(f"127.0.0.1:{port}").is_server_live()


def test_a_killed_device_process_makes_the_front_ends_answer_503_and_exit(
        tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with split_server(*GATED, env={"GATE_FILE": str(gate)}) as (proc, url), \
            ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(post, url, [[i, i]]) for i in range(4)]
        wait_until_sync(lambda: metric(url, "batchserve_in_flight_requests") == 4,
                        "4 requests in flight")
        fronts = children(proc.pid)
        proc.kill()  # the device process
        answers = [f.result() for f in futures]
        assert all(r.status_code == 503 and r.json()["error"]["type"] == "unhealthy"
                   for r in answers)
        assert proc.wait(WAIT_S) != 0
        wait_until_sync(lambda: not any(Path(f"/proc/{pid}").exists() for pid in fronts),
                        "the front ends gone")


def test_grpc_is_served_by_every_front_end_into_the_one_device_process(
        tmp_path: Path) -> None:
    """Each front end serves gRPC on the one port: calls on fresh channels (either front end)
    are answered, counted once as gRPC, and a load through one is seen through all."""
    import grpc
    import numpy as np
    import tritonclient.grpc as triton
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    (tmp_path / "lin").mkdir()
    (tmp_path / "lin" / "config.toml").write_text('model = "linear"\n')
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.toml").write_text('model = "linear"\n')
    port = free_port()
    with split_server("--model-repository", str(tmp_path), "--devices", "cpu",
                      "--model-control-mode", "explicit", "--load-model", "lin",
                      "--frontends", "2", "--grpc-port", str(port)) as (_, url):
        target = f"127.0.0.1:{port}"
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        inp = triton.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        want = triton.InferenceServerClient(target).infer("lin", [inp]).as_numpy("OUTPUT0")
        for _ in range(8):  # a new channel each: the kernel may hand it to either front end
            client = triton.InferenceServerClient(target)
            np.testing.assert_array_equal(client.infer("lin", [inp]).as_numpy("OUTPUT0"), want)
            health = health_pb2_grpc.HealthStub(grpc.insecure_channel(target))
            status = health.Check(health_pb2.HealthCheckRequest(service="lin")).status
            assert status == health_pb2.HealthCheckResponse.SERVING
            client.close()
        assert metric(url, "batchserve_requests_total", protocol="grpc", status="200") == 9
        triton.InferenceServerClient(target).load_model("other")
        for _ in range(6):
            client = triton.InferenceServerClient(target)
            assert client.is_model_ready("other")
            assert client.infer("other", [inp]).as_numpy("OUTPUT0").shape == (1, 2)
            client.close()
