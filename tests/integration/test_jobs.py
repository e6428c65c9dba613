"""Job-queue mode against a real redis-server on a free loopback port, workers as processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis
import torch

from app.jobs.client import submit
from app.jobs.messages import RESULT_KEY, RESULTS_STREAM
from app.models.builtin import linear_module
from tests.conftest import ROOT, WAIT_S, free_port, sample, wait_until_sync
from tests.otlp import attributes, receiving

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed"),
]
STREAM, GROUP = "batchserve:jobs", "batchserve"


@contextmanager
def redis_server(folder: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server on a free loopback port, up: its URL and its process."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"

    def up() -> bool:
        try:
            return bool(redis.Redis.from_url(url).ping())
        except redis.ConnectionError:
            return False

    try:
        wait_until_sync(up, "redis-server up")
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(WAIT_S)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as (url, _):
        yield url


@contextmanager
def worker(url: str, *args: str, env: dict[str, str] | None = None,
           ) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "worker", "--redis-url", url, "--devices", "cpu",
         "--log-level", "warning", *args],
        cwd=ROOT, env={**os.environ, **(env or {})},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT_S)


def expected(instances: list[Any]) -> np.ndarray:
    with torch.inference_mode():
        return linear_module()(torch.tensor(instances, dtype=torch.float32)).numpy()


def pending_count(r: redis.Redis) -> int:
    """Entries read by a worker and not yet acknowledged (0 before the group exists)."""
    try:
        return int(r.xpending(STREAM, GROUP)["pending"])
    except redis.ResponseError:  # NOGROUP: no worker has started yet
        return 0


def results_of(r: redis.Redis, ids: list[str]) -> dict[str, Any]:
    bodies = r.mget([RESULT_KEY + i for i in ids])
    return {i: orjson.loads(b) for i, b in zip(ids, bodies, strict=True) if b is not None}


def test_jobs_in_results_out_with_metrics_and_liveness(redis_url: str) -> None:
    jobs = [[[i, i + 1, i + 2, i + 3]] * (1 + i % 3) for i in range(20)]
    port = free_port()  # for the worker's metrics server
    r = redis.Redis.from_url(redis_url)
    with worker(redis_url, "--model", "linear", "--worker-metrics-port", str(port)):
        results = submit(redis_url, jobs, timeout_s=WAIT_S)
        wait_until_sync(lambda: r.keys("batchserve:worker:*"), "liveness key")
        live = orjson.loads(r.get(r.keys("batchserve:worker:*")[0]))
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S).text
    for job, result in zip(jobs, results, strict=True):
        assert result["status"] == "ok"
        np.testing.assert_allclose(result["predictions"], expected(job), rtol=1e-6, atol=1e-6)
    assert r.xlen(STREAM) == 0 and pending_count(r) == 0  # acknowledged and deleted
    assert r.xlen(RESULTS_STREAM) == 20
    assert {"consumer", "held", "stream_lag"} <= set(live)
    assert sample(text, "batchserve_jobs_done_total") == 20
    assert sample(text, "batchserve_batch_size_sum") == sum(len(job) for job in jobs)
    assert "batchserve_job_stream_lag" in text and "batchserve_job_lease_renewals_total" in text


def test_submit_command_prints_one_result_per_job(redis_url: str, tmp_path: Path) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text("[1, 2, 3, 4]\n[0, 0, 0, 1]\n\n[4, 3, 2, 1]\n")
    with worker(redis_url, "--model", "linear"):
        proc = subprocess.run(
            [sys.executable, "-m", "app", "submit", str(lines), "--redis-url", redis_url,
             "--job-size", "2"],
            cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S,
        )
    assert proc.returncode == 0, proc.stderr
    results = [orjson.loads(line) for line in proc.stdout.splitlines()]
    assert [len(res["predictions"]) for res in results] == [2, 1]
    np.testing.assert_allclose(results[0]["predictions"], expected([[1, 2, 3, 4], [0, 0, 0, 1]]),
                               rtol=1e-6, atol=1e-6)
    assert "2/2" in proc.stderr  # the progress bar


def test_malformed_jobs_get_error_results_or_the_dead_letter_stream(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    bad = {
        "shape": {"id": "shape", "instances": [[1, 2]]},
        "empty": {"id": "empty", "instances": []},
        "notlist": {"id": "notlist", "instances": "x"},
        "nan": {"id": "nan", "instances": [[1, 2, 3, "NaN"]]},
    }
    for payload in bad.values():
        r.xadd(STREAM, {"job": orjson.dumps(payload)})
    r.xadd(STREAM, {"job": b"{not json"})
    r.xadd(STREAM, {"job": orjson.dumps({"instances": [[1, 2, 3, 4]]})})  # no id
    r.xadd(STREAM, {"other": b"field"})
    with worker(redis_url, "--model", "linear") as proc:
        good = submit(redis_url, [[[1, 2, 3, 4]]], timeout_s=WAIT_S)
        wait_until_sync(lambda: r.xlen(STREAM) == 0 and pending_count(r) == 0, "all handled")
        assert proc.poll() is None  # still serving
    assert good[0]["status"] == "ok"
    results = results_of(r, list(bad))
    assert {k: v["status"] for k, v in results.items()} == dict.fromkeys(bad, "error")
    assert all(v["error"]["type"] == "invalid_input" for v in results.values())
    assert "instances[0]" in results["shape"]["error"]["message"]
    dead = r.xrange(STREAM + ":dead")
    assert [fields[b"reason"] for _, fields in dead] == [b"no_id"] * 3
    whys = sorted(fields[b"why"].decode() for _, fields in dead)  # what was wrong, each
    assert whys[1].startswith("'job' is not JSON: unexpected character")
    assert [whys[0], whys[2]] == ["'job' has no 'id': a job is a JSON object whose 'id' is a "
                                  "string, not empty", "the entry has no 'job' field"]


def test_two_workers_share_the_stream_and_each_job_is_done_once(redis_url: str) -> None:
    jobs = [[[i, 0, 0, 1]] for i in range(200)]
    r = redis.Redis.from_url(redis_url)
    with worker(redis_url, "--model", "linear"), worker(redis_url, "--model", "linear"):
        wait_until_sync(lambda: len(r.keys("batchserve:worker:*")) == 2, "both workers up")
        results = submit(redis_url, jobs, timeout_s=WAIT_S)
    assert all(res["status"] == "ok" for res in results)
    announced = [fields[b"id"].decode() for _, fields in r.xrange(RESULTS_STREAM)]
    assert sorted(announced) == sorted(res["id"] for res in results)  # once each
    assert r.xlen(STREAM) == 0 and pending_count(r) == 0


def test_kill_9_loses_no_job(redis_url: str) -> None:
    jobs = [[[float(i), 1.0]] for i in range(12)]
    out: dict[str, Any] = {}
    submitter = threading.Thread(
        target=lambda: out.update(results=submit(redis_url, jobs, timeout_s=WAIT_S))
    )
    r = redis.Redis.from_url(redis_url)
    slow = ("--model", "tests.fakes:sleep_module", "--max-batch-size", "1", "--job-lease-s", "2")
    with worker(redis_url, *slow, env={"SLEEP_S": "0.5"}) as first:
        submitter.start()
        wait_until_sync(lambda: pending_count(r) > 0, "first holds jobs")
        first.send_signal(signal.SIGKILL)
        first.wait(WAIT_S)
    held_by_the_dead = pending_count(r)
    assert held_by_the_dead > 0
    with worker(redis_url, *slow, env={"SLEEP_S": "0.01"}):
        submitter.join(WAIT_S)
    assert not submitter.is_alive()
    results = out["results"]
    assert [res["status"] for res in results] == ["ok"] * len(jobs)
    assert [res["predictions"] for res in results] == [[[2.0 * i, 2.0]] for i in range(12)]
    assert r.xlen(STREAM) == 0 and pending_count(r) == 0


def test_poison_jobs_are_dead_lettered_after_max_deliveries(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    entry = r.xadd(STREAM, {"job": orjson.dumps({"id": "poison", "instances": [[1, 2, 3, 4]]})})
    # Two workers took it and died without finishing (each delivery counts).
    r.xreadgroup(GROUP, "lost-1", {STREAM: ">"}, count=1)
    r.xclaim(STREAM, GROUP, "lost-2", 0, [entry])
    with worker(redis_url, "--model", "linear", "--job-lease-s", "0.5",
                "--job-max-deliveries", "2"):
        wait_until_sync(lambda: r.exists(RESULT_KEY + "poison"), "result written")
        fine = submit(redis_url, [[[1, 2, 3, 4]]], timeout_s=WAIT_S)
    result = results_of(r, ["poison"])["poison"]
    assert result["status"] == "error" and result["error"]["type"] == "gave_up"
    dead = r.xrange(STREAM + ":dead")
    assert len(dead) == 1 and dead[0][1][b"reason"] == b"max_deliveries"
    assert dead[0][1][b"why"].decode() == result["error"]["message"]  # delivered 2 times ...
    assert orjson.loads(dead[0][1][b"job"])["id"] == "poison"
    assert fine[0]["status"] == "ok"
    assert r.xlen(STREAM) == 0 and pending_count(r) == 0


def test_a_job_that_kills_every_worker_is_dead_lettered(redis_url: str) -> None:
    """Real crashes: each worker that takes the poison job dies; the next takes it over after
    the lease; once it was delivered max_deliveries times it is given up, and the worker that
    gave it up goes on serving."""
    r = redis.Redis.from_url(redis_url)
    r.xadd(STREAM, {"job": orjson.dumps({"id": "poison", "instances": [[666, 1]]})})
    args = ("--model", "tests.fakes:poison_module", "--job-lease-s", "0.5",
            "--job-max-deliveries", "2")
    for delivery in (1, 2):
        with worker(redis_url, *args) as proc:
            assert proc.wait(WAIT_S) == 3, f"delivery {delivery} should kill the worker"
    with worker(redis_url, *args) as survivor:
        wait_until_sync(lambda: r.exists(RESULT_KEY + "poison"), "poison given up")
        fine = submit(redis_url, [[[1, 2]]], timeout_s=WAIT_S)
        assert survivor.poll() is None
    result = results_of(r, ["poison"])["poison"]
    assert result["status"] == "error" and result["error"]["type"] == "gave_up"
    assert [f[b"reason"] for _, f in r.xrange(STREAM + ":dead")] == [b"max_deliveries"]
    assert fine[0]["predictions"] == [[2.0, 4.0]]
    assert r.xlen(STREAM) == 0 and pending_count(r) == 0


def test_jobs_read_while_a_device_thread_restarts_wait_for_it(redis_url: str) -> None:
    """A job that kills the device thread gets its error; the jobs after it, read during the
    restart, wait for the new thread instead of failing ``unhealthy``."""
    r = redis.Redis.from_url(redis_url)
    with worker(redis_url, "--model", "tests.fakes:CrashingHandler"):
        crash = submit(redis_url, [[666]], timeout_s=WAIT_S)
        results = submit(redis_url, [[i] for i in range(20)], timeout_s=WAIT_S)
    assert crash[0]["status"] == "error"
    assert [res.get("predictions") for res in results] == [[2.0 * i] for i in range(20)], \
        [res.get("error") for res in results]
    assert r.xlen(STREAM) == 0 and pending_count(r) == 0


def device_up(port: int) -> float | None:
    """``batchserve_device_up`` from a worker's metrics (None until it serves them, 0 until
    its device thread is up)."""
    try:
        return sample(httpx.get(f"http://127.0.0.1:{port}/metrics").text, "batchserve_device_up")
    except httpx.TransportError:
        return None


def test_a_stuck_device_thread_stops_the_worker_with_exit_1(redis_url: str,
                                                             tmp_path: Path) -> None:
    """A call past ``device_timeout_s``: the worker takes no more jobs (one its last read
    brought is left unanswered), answers the stuck job (it times out) and exits 1; the jobs it
    did not answer are another worker's after their lease."""
    r = redis.Redis.from_url(redis_url)
    gate = tmp_path / "gate"
    port = free_port()
    args = ("--model", "tests.fakes:gate_file_module", "--device-timeout-s", "1",
            "--request-timeout-s", "4", "--job-lease-s", "1", "--worker-metrics-port", str(port))
    add = lambda job_id: r.xadd(STREAM, {"job": orjson.dumps(  # noqa: E731
        {"id": job_id, "instances": [[1.0, 2.0]]})})
    with worker(redis_url, *args, env={"GATE_FILE": str(gate)}) as proc:
        # Its metrics are served before its device thread starts: 0 then is no device yet.
        wait_until_sync(lambda: device_up(port) == 1, "the device thread up")
        add("stuck")
        wait_until_sync(lambda: device_up(port) == 0, "stuck seen")
        add("later")
        assert proc.wait(WAIT_S) == 1
    assert results_of(r, ["stuck"])["stuck"]["error"]["type"] == "timeout"
    assert results_of(r, ["later"]) == {}  # read, if at all, and left for the lease
    gate.touch()
    with worker(redis_url, *args, env={"GATE_FILE": str(gate)}):
        wait_until_sync(lambda: r.exists(RESULT_KEY + "later"), "taken by the next worker")
    assert results_of(r, ["later"])["later"]["predictions"] == [[2.0, 4.0]]


def test_sigterm_finishes_what_is_held_then_exits_0(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    ids = [f"job-{i}" for i in range(20)]
    for job_id in ids:
        r.xadd(STREAM, {"job": orjson.dumps({"id": job_id, "instances": [[1.0, 2.0]]})})
    args = ("--model", "tests.fakes:sleep_module", "--max-batch-size", "1")
    with worker(redis_url, *args, env={"SLEEP_S": "0.3"}) as proc:
        wait_until_sync(lambda: pending_count(r) > 0, "jobs held")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
    assert pending_count(r) == 0  # everything it held was finished and acknowledged
    done = results_of(r, ids)
    assert done and all(res["status"] == "ok" for res in done.values())
    assert r.xlen(STREAM) == len(ids) - len(done)  # the rest waits for the next worker


def test_a_jobs_spans_join_its_senders_trace(redis_url: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    caller = TracerProvider().get_tracer("caller")
    with receiving() as receiver:
        # The standard OTLP variable turns tracing on in the worker.
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "workers"}
        with worker(redis_url, "--model", "linear", env=env) as proc:
            with caller.start_as_current_span("caller") as span:
                (result,) = submit(redis_url, [[[1, 2, 3, 4]]], timeout_s=WAIT_S)
            proc.send_signal(signal.SIGTERM)  # it sends its buffered spans as it stops
            assert proc.wait(WAIT_S) == 0
    assert result["status"] == "ok"
    context = span.get_span_context()
    (job,) = receiver.named("job")
    assert job.trace_id == context.trace_id.to_bytes(16, "big")
    assert job.parent_span_id == context.span_id.to_bytes(8, "big")
    assert attributes(job)["http.response.status_code"] == 200
    assert sorted(s.name for s in receiver.spans if s.parent_span_id == job.span_id) == [
        "device", "queue"]
    assert len(receiver.named("batch")) == 1


def run_app(*args: str, timeout: float = WAIT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_submit_and_worker_fail_in_one_line(redis_url: str, tmp_path: Path) -> None:
    """A missing file, a line that is not JSON, a Redis that is down, results that do not come
    in time: one line on stderr and a non-zero exit, never a traceback."""
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("[1, 2, 3, 4]\n")
    bad.write_text("[1, 2, 3, 4]\nnot json\n")
    # nothing listens there; its password is never shown
    down = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    cases = [
        (["submit", str(tmp_path / "missing.jsonl")], 2, "cannot read"),
        (["submit", str(bad)], 2, "bad.jsonl line 2 is not JSON"),
        (["submit", str(good), "--redis-url", down, "--quiet"], 1, "cannot use Redis at"),
        (["submit", str(good), "--redis-url", redis_url, "--quiet", "--timeout-s", "0.5"], 1,
         "1 of 1 jobs have no result yet after 0.5 s"),  # no worker runs
    ]
    for args, code, says in cases:
        proc = run_app(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == code and len(lines) == 1 and says in lines[0], proc.stderr
        assert "hunter2" not in proc.stderr
    proc = run_app("worker", "--redis-url", down, "--model", "linear", "--devices", "cpu",
                   "--log-level", "warning")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot use Redis at redis://:***@" in lines[0], proc.stderr
    assert "hunter2" not in proc.stderr


def test_redis_lost_stops_the_worker_in_lines_without_a_traceback(tmp_path: Path) -> None:
    """Redis gone while jobs are held: a line for each job not finished (it stays pending, for
    another worker after its lease) or renewal that failed, one line saying why the worker
    stops, exit 1."""
    with redis_server(tmp_path) as (url, server):
        held = ("--model", "tests.fakes:sleep_module", "--max-batch-size", "1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "worker", "--redis-url", url, "--devices", "cpu",
             "--log-level", "warning", *held],
            cwd=ROOT, env={**os.environ, "SLEEP_S": "0.5"}, stderr=subprocess.PIPE, text=True)
        try:
            r = redis.Redis.from_url(url)
            for i in range(20):  # 0.5 s each, two held at a time: held at the kill
                r.xadd(STREAM, {"job": orjson.dumps({"id": f"j{i}", "instances": [[1.0, 2.0]]})})
            wait_until_sync(lambda: pending_count(r) >= 2, "the worker holds jobs")
            server.kill()
            server.wait(WAIT_S)
            _, stderr = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert "cannot use Redis at" in lines[-1], stderr
    assert all("(Redis: " in line for line in lines[:-1]), stderr  # a lease renewal's too
    assert any("could not be finished (Redis: " in line for line in lines[:-1]), stderr


def test_an_idle_worker_stops_within_a_second_of_sigterm(redis_url: str) -> None:
    """The claim loop rests job_lease_s / 4 between scans (30 s here); SIGTERM ends the rest at
    once (the bound below is a third of that rest, far above the second it takes)."""
    with worker(redis_url, "--model", "linear", "--job-lease-s", "120") as proc:
        r = redis.Redis.from_url(redis_url)
        wait_until_sync(lambda: r.keys("batchserve:worker:*"), "the worker up")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
        assert time.monotonic() - started < 10.0
