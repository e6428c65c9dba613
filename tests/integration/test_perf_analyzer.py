"""Triton's own load generator, perf_analyzer, drives the server over HTTP and gRPC.

It reads the model's metadata and configuration, sends binary or JSON tensors from an
``--input-data`` file and checks every answer against that file's ``validation_data``. The binary
is fetched by ``make tools`` (.ci/perf-analyzer); without it these tests skip.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import (
    ROOT,
    WAIT_S,
    LiveServer,
    free_port,
    live_server,
    make_settings,
    metric,
    sample,
    split_server,
)

PERF_ANALYZER = Path(os.environ.get("PERF_ANALYZER",
                                    ROOT / ".tools" / "perf_analyzer" / "perf_analyzer"))


def _runs() -> bool:
    try:
        return subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True,
                              timeout=WAIT_S).returncode == 0
    except OSError:
        return False


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _runs(), reason="perf_analyzer is not here (make tools fetches it)"),
]

# tests.fakes:pair_module gives [x, 2x] for each row x of 3: exact in any batch, so answers can be
# compared bit for bit, and it declares no output shape: perf_analyzer learns [2, 3] from us.
ROWS = [[float(i), 0.5, -2.0 * i - 1.0] for i in range(6)]  # no -0.0: compared bit for bit


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(make_settings(model="tests.fakes:pair_module", max_instances=8),
                     grpc=True) as srv:
        yield srv


def input_data(path: Path, wrong: bool = False) -> Path:
    answers = [np.stack([np.array(x), 2 * np.array(x)]) + (1.0 if wrong else 0.0) for x in ROWS]
    path.write_text(json.dumps({
        "data": [{"INPUT0": x} for x in ROWS],
        "validation_data": [{"OUTPUT0": a.reshape(-1).tolist()} for a in answers],
    }))
    return path


def perf_analyzer(server: LiveServer, data: Path | str, fmt: str, concurrency: int,
                  protocol: str = "http", *extra: str) -> subprocess.CompletedProcess[str]:
    """One run; over gRPC the tensors are always raw (``fmt`` applies to HTTP, but for
    ``streaming``: ModelStreamInfer's calls); ``data``: a file, or its ``zero`` or ``random``;
    ``extra``: more of its options."""
    url = server.url.removeprefix("http://") if protocol == "http" else server.grpc_url
    assert url is not None
    return run_perf_analyzer(url, data, fmt, concurrency, protocol, *extra)


# Windows of 40 answers, three of them (its stability window) at the least, each taken as
# stable. Not ``--request-count``: with it perf_analyzer's workers stop at that count, but the
# records it counts them by are emptied once they have started (InferenceProfiler::
# ProfileHelper), so answers that come back before that are lost to it and it waits forever
# for them (seen here about once in 60 runs, every answer sent and valid).
WINDOWS = ["--measurement-mode", "count_windows", "--measurement-request-count", "40",
           "--stability-percentage", "100000"]
MEASURED = 3 * 40  # the fewest answers a run counts


def run_perf_analyzer(url: str, data: Path | str, fmt: str, concurrency: int,
                      protocol: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """A run against ``url`` (host:port) in ``protocol`` of ``MEASURED`` answers or more."""
    formats = ["--input-tensor-format", fmt, "--output-tensor-format", fmt] \
        if protocol == "http" else ["--streaming"] if fmt == "streaming" else []
    try:
        return subprocess.run(
            [str(PERF_ANALYZER), "-m", "pair_module", "-u", url, "-i", protocol,
             "--input-data", str(data), *formats, "--concurrency-range", str(concurrency),
             *WINDOWS, *extra],
            capture_output=True, text=True, timeout=WAIT_S * 2,
        )
    except subprocess.TimeoutExpired as exc:  # what it printed says where it waited
        pytest.fail(f"perf_analyzer ran past {exc.timeout} s; it printed:\n"
                    f"{_text(exc.stdout)[-3000:]}\n{_text(exc.stderr)[-3000:]}")


def _text(out: str | bytes | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def server_side(out: str) -> int:
    """The requests perf_analyzer's last report says the server answered, by the server's own
    statistics (its "Server:" part, printed when the server has the statistics extension)."""
    counts = re.findall(r"Server: \n\s+Inference count: \d+\n\s+Execution count: \d+\n"
                        r"\s+Successful request count: (\d+)", out)
    assert counts, f"perf_analyzer gave no server-side figures:\n{out[-2000:]}"
    return int(counts[-1])


@pytest.mark.parametrize(("protocol", "fmt"), [("http", "binary"), ("http", "json"),
                                               ("grpc", "binary"), ("grpc", "streaming")])
@pytest.mark.parametrize("concurrency", [1, 8])
def test_perf_analyzer_drives_the_server(server: LiveServer, tmp_path: Path, protocol: str,
                                         fmt: str, concurrency: int) -> None:
    registry = server.app.state.service.metrics.registry
    before = sample(registry, "batchserve_requests_total", status="200", protocol=protocol)
    proc = perf_analyzer(server, input_data(tmp_path / "data.json"), fmt, concurrency, protocol)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"Request concurrency: {concurrency}" in proc.stdout and "p99 latency" in proc.stdout
    # It read our statistics extension: the requests the server answered in its windows
    # (those in flight at a window's edge fall on either side of it).
    assert server_side(proc.stdout) >= MEASURED // 2
    assert sample(registry, "batchserve_requests_total", status="200", protocol=protocol) \
        - before >= MEASURED


@pytest.mark.parametrize(("protocol", "fmt"), [("http", "binary"), ("http", "json"),
                                               ("grpc", "binary")])
def test_its_generated_zeros_are_served(server: LiveServer, protocol: str, fmt: str) -> None:
    """``--input-data zero``, no file: what docs/v2.md gives for a float model, whose rows its
    default random bits fill with NaN and infinities now and then (refused, as any request
    holding them is)."""
    registry = server.app.state.service.metrics.registry
    before = sample(registry, "batchserve_requests_total", status="200", protocol=protocol)
    proc = perf_analyzer(server, "zero", fmt, 2, protocol)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sample(registry, "batchserve_requests_total", status="200", protocol=protocol) \
        - before >= MEASURED


@pytest.mark.parametrize(("protocol", "fmt"), [("http", "binary"), ("grpc", "binary"),
                                               ("grpc", "streaming")])
def test_answers_in_flight_together_are_each_valid(server: LiveServer, tmp_path: Path,
                                                   protocol: str, fmt: str) -> None:
    """24 requests in flight at once (``--async`` or one stream), each answer checked against
    its own request's validation_data. perf_analyzer checks an async answer against the data of
    the last request its thread sent (InferContext::ValidateOutputs), so a thread must hold one
    request at a time: ``--max-threads`` (16 by default) at the concurrency (docs/v2.md)."""
    mode = [] if fmt == "streaming" else ["--async"]
    proc = perf_analyzer(server, input_data(tmp_path / "data.json"), fmt, 24, protocol, *mode,
                         "--max-threads", "24")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Request concurrency: 24" in proc.stdout


@pytest.mark.parametrize(("protocol", "fmt"), [("http", "json"), ("grpc", "binary"),
                                               ("grpc", "streaming")])
def test_wrong_answers_fail_its_validation(server: LiveServer, tmp_path: Path,
                                           protocol: str, fmt: str) -> None:
    """The check above is real: answers that differ from validation_data fail the run."""
    proc = perf_analyzer(server, input_data(tmp_path / "wrong.json", wrong=True), fmt, 1,
                         protocol)
    assert proc.returncode != 0
    assert "doesn't match expected output" in proc.stdout + proc.stderr


def test_perf_analyzer_drives_two_front_ends(tmp_path: Path) -> None:
    """Against ``--frontends 2`` (either front end may take each of its connections): every
    answer valid over HTTP (binary and JSON) and gRPC, and each counted in the one
    ``/metrics`` (that it is counted once is test_frontends.py's, with a known number sent)."""
    grpc_port = free_port()
    data = input_data(tmp_path / "data.json")
    with split_server("--model", "tests.fakes:pair_module", "--max-instances", "8",
                      "--frontends", "2", "--grpc-port", str(grpc_port)) as (_, url):
        runs = [("http", "binary"), ("http", "json"), ("grpc", "binary"), ("grpc", "streaming")]
        for protocol, fmt in runs:
            target = url.removeprefix("http://") if protocol == "http" \
                else f"127.0.0.1:{grpc_port}"
            proc = run_perf_analyzer(target, data, fmt, 8, protocol)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            assert server_side(proc.stdout) >= MEASURED // 2
        for protocol in ("http", "grpc"):
            measured = MEASURED * sum(p == protocol for p, _ in runs)
            assert metric(url, "batchserve_requests_total", protocol=protocol,
                          status="200") >= measured
