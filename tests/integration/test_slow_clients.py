"""Clients that hold connections: one stalled in its headers or body is answered 408 and cut
off within ``read_timeout_s``; past ``max_connections`` a new one gets 503, not a hang."""

from __future__ import annotations

import resource
import select
import socket
import time
from pathlib import Path

import httpx
import pytest

from app.logs import STALLED
from app.process import OWN_FILES
from app.values import SLOW_LINK_S
from tests.conftest import WAIT_S, children, sample, serve, wait_ready, wait_until_sync

pytestmark = pytest.mark.slow


def raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize("sent", [
    b"",  # connected, never a byte
    b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Le",  # stalled in its headers
    b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n{\"instances\": [[1",  # in its body
    b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{",
    b"GET /health_check HTTP/1.1\r\nHost: x\r\n",  # a proxied path, with two front ends
])
@pytest.mark.parametrize("frontends", ["1", "2"])
def test_a_stalled_request_is_answered_408_and_closed(sent: bytes, frontends: str) -> None:
    with serve("--model", "linear", "--devices", "cpu", "--read-timeout-s", "0.5",
               "--frontends", frontends) as (_, url):
        wait_ready(url)
        sock = raw(url)
        started = time.monotonic()
        sock.sendall(sent)
        answer = read_all(sock)  # returns once the server closes
        sock.close()
        assert time.monotonic() - started < WAIT_S
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
        v2 = sent.startswith(b"POST /v2/")
        assert answer.endswith(b'{"error":"the request did not arrive within 0.5 s"}' if v2 else
                               b'"message":"the request did not arrive within 0.5 s"}}')
        if b"\r\n\r\n" in sent:  # the app had the request: it is counted, as a 408
            metrics = httpx.get(url + "/metrics", timeout=10).text
            assert sample(metrics, "batchserve_requests_total", status="408") == 1
        assert httpx.post(url + "/predict", json={"instances": [[1, 2, 3, 4]]},
                          timeout=10).status_code == 200


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_an_answer_before_the_body_a_client_waits_to_send_closes_the_connection(
        frontends: str) -> None:
    """A client that sent ``Expect: 100-continue`` and is answered before its body was asked
    for sends none: the answer says ``Connection: close`` and the connection closes at once,
    not after ``read_timeout_s`` with the client's next request taken for that body. Asked for
    (``100 Continue``), the body is read and the connection serves on."""
    with serve("--model", "linear", "--devices", "cpu", "--read-timeout-s", "600",
               "--frontends", frontends) as (_, url):
        wait_ready(url)
        for path, length, status in [(b"/models/nope/predict", b"100", b"404"),
                                     (b"/v2/models/nope/infer", b"100", b"404"),
                                     (b"/predict", b"100000000000", b"413")]:
            sock = raw(url)
            sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                         b"Content-Length: " + length + b"\r\n\r\n")
            head = read_all(sock).split(b"\r\n\r\n")[0]  # returns once the server closes
            sock.close()
            assert head.startswith(b"HTTP/1.1 " + status) and b"\r\nconnection: close" in head
        sock = raw(url)
        body = b'{"instances": [[1, 2, 3, 4]]}'
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body + b"GET /health_check HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answers = read_all(sock)
        sock.close()
        assert answers.count(b"HTTP/1.1 200 OK\r\n") == 2 and b'"predictions"' in answers


def test_an_idle_connection_is_kept_keep_alive_s_then_closed() -> None:
    """A gateway reuses its connections: one idle past uvicorn's own 5 s still takes a request
    when ``keep_alive_s`` says 8, and is closed once idle for that long (the answer whole)."""
    with serve("--model", "linear", "--devices", "cpu", "--keep-alive-s", "8",
               "--frontends", "2") as (_, url):
        wait_ready(url)
        sock = raw(url)
        body = b'{"instances": [[1, 2, 3, 4]]}'
        request = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.sendall(request)
        first = b""
        while not first.endswith(b"]]}") and (chunk := sock.recv(65536)):
            first += chunk
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(b"]]}"), first
        time.sleep(6)
        sock.sendall(request)
        second = read_all(sock)  # returns once the server closes the idle connection
        sock.close()
        assert second.startswith(b"HTTP/1.1 200 OK\r\n") and second.endswith(b"]]}"), second


def tcp_state(sock: socket.socket) -> int:
    """The connection's state as the kernel sees it (struct tcp_info's first byte)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


TCP_CLOSE = 7  # Linux's TCP_CLOSE: reset by the peer


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_a_client_that_takes_none_of_its_answer_is_reset(frontends: str, tmp_path: Path
                                                         ) -> None:
    """A few bytes asked, 23 MB answered, none of it read: the connection is reset once
    ``read_timeout_s`` (5 s at least) passes without the client taking any, where it was held
    (and the answer's bytes with it) for as long as the client stayed connected."""
    log = tmp_path / "stderr"
    with log.open("wb") as out, serve(
            "--model", "tests.fakes:widen", "--devices", "cpu", "--read-timeout-s", "0.5",
            "--frontends", frontends, stderr=out.fileno()) as (_, url):
        wait_ready(url)
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        body = b'{"instances": [%s]}' % b", ".join([b"[1.0]"] * 256)
        sent = time.monotonic()
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until_sync(lambda: tcp_state(sock) == TCP_CLOSE, "the server to reset it")
        assert time.monotonic() - sent >= SLOW_LINK_S  # not the 0.5 s a request may take
        with pytest.raises(ConnectionResetError):
            read_all(sock)
        sock.close()
        assert httpx.post(url + "/predict", json={"instances": [[1.0]]},
                          timeout=10).status_code == 200
    assert STALLED in log.read_text()


def status_on_a_new_connection(url: str) -> int:
    with httpx.Client(timeout=10) as client:
        return client.post(url + "/predict", json={"instances": [[1, 2, 3, 4]]}).status_code


def test_max_connections_are_served_and_one_more_gets_503(tmp_path: Path) -> None:
    """And the refusals are not a log line each (uvicorn warns once a refusal): a flood of
    them would flood the log."""
    log = tmp_path / "stderr"
    with log.open("wb") as out, serve("--model", "linear", "--devices", "cpu",
                                      "--max-connections", "3", stderr=out.fileno()) as (_, url):
        wait_ready(url)

        def status() -> int:
            return status_on_a_new_connection(url)

        idle = [raw(url) for _ in range(2)]
        wait_until_sync(lambda: status() == 200, "the third open connection served")
        idle.append(raw(url))
        wait_until_sync(lambda: status() == 503, "503 once the idle ones are accepted")
        assert [status() for _ in range(20)] == [503] * 20
        for sock in idle:
            sock.close()
        wait_until_sync(lambda: status() == 200, "served again once they are gone")
        assert_refusals_counted(url, 21)
    lines = log.read_text().count("Exceeded concurrency limit.")
    assert 1 <= lines < 21


def assert_refusals_counted(url: str, at_least: int) -> None:
    """/metrics counts the requests refused past max_connections, which no route saw: as
    requests for no model (model ""), answered 503, and rejected for "connections"."""
    text = httpx.get(url + "/metrics", timeout=10).text
    rejected = sample(text, "batchserve_rejected_total", model="", reason="connections")
    answered = sample(text, "batchserve_requests_total", model="", status="503",
                      protocol="http")
    assert rejected == answered >= at_least


def test_refusals_past_max_connections_are_counted_once_across_front_ends() -> None:
    with serve("--model", "linear", "--devices", "cpu", "--max-connections", "1",
               "--frontends", "2") as (_, url):
        wait_ready(url)
        idle: list[socket.socket] = []
        refused = 0

        def one_more_refused() -> bool:
            nonlocal refused
            idle.append(raw(url))  # holds its front end's place, whichever it reached
            refused += status_on_a_new_connection(url) == 503
            return refused >= 3

        wait_until_sync(one_more_refused, "three refusals")
        for sock in idle:
            sock.close()
        wait_until_sync(lambda: status_on_a_new_connection(url) == 200, "served again")
        wait_until_sync(lambda: sample(httpx.get(url + "/metrics", timeout=10).text,
                                       "batchserve_rejected_total", reason="connections")
                        >= refused, "the front ends' counts at the device process")
        assert_refusals_counted(url, refused)


def open_files_limit(pid: int) -> int:
    """A process's soft limit on open files."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open-files line in /proc/{pid}/limits")


def test_max_connections_hold_under_a_low_soft_limit_on_open_files() -> None:
    """Started with a soft limit on open files below what ``max_connections`` needs (as a
    container's 1024 under a higher hard limit), the server raises it, and the front ends it
    starts have it too: the connection past ``max_connections`` is refused 503, not closed
    unanswered once the process runs out of descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 300 + OWN_FILES
    if soft < 400 or hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs open-file limits of 400 (soft) and {needed} (hard)")
    low = ("sh", "-c", 'ulimit -S -n 100 && exec "$@"', "sh")
    with serve("--model", "linear", "--devices", "cpu", "--max-connections", "300",
               wrap=low) as (proc, url):
        wait_ready(url)
        assert open_files_limit(proc.pid) == needed
        idle = [raw(url) for _ in range(300)]
        wait_until_sync(lambda: status_on_a_new_connection(url) == 503,
                        "503 once the idle ones are accepted")
        for sock in idle:
            sock.close()
    with serve("--model", "linear", "--devices", "cpu", "--max-connections", "300",
               "--frontends", "2", wrap=low) as (proc, url):
        wait_ready(url)
        wait_until_sync(lambda: len(children(proc.pid)) == 2, "two front ends")
        assert [open_files_limit(pid) for pid in [proc.pid, *children(proc.pid)]] == \
            [needed] * 3


def test_front_ends_reach_the_device_process_past_max_connections() -> None:
    """Each front end takes ``max_connections`` clients; its own requests to the device
    process (health, metadata) count against no bound: with one each, both are served."""
    with serve("--model", "linear", "--devices", "cpu", "--max-connections", "1",
               "--frontends", "2") as (_, url):
        wait_ready(url)
        for _ in range(10):  # new connections: the kernel gives them to either front end
            assert httpx.get(url + "/health_check", timeout=10).status_code == 200
            assert httpx.get(url + "/v2/models/linear", timeout=10).status_code == 200


def test_a_websocket_upgrade_is_answered_in_http_1_1() -> None:
    """The server serves no WebSocket: an upgrade to one is declined, the request answered as
    if it had not asked (as an h2c upgrade is), not a 400 for an invalid request."""
    with serve("--model", "linear", "--devices", "cpu") as (_, url):
        wait_ready(url)
        sock = raw(url)
        sock.sendall(b"GET /health_check HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\n"
                     b"upgrade: websocket\r\nsec-websocket-version: 13\r\n"
                     b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        answer = sock.recv(65536)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b'"status":"ready"' in answer


MIB = 2**20


def large_request(path: bytes = b"/predict") -> tuple[bytes, bytes]:
    """A request of a 1 MiB body, split where a client that stalls before its end stops: the
    head and the body's first 256 KiB (more than a process reads before its app asks for the
    body), then the rest."""
    body = b'{"instances": [[1, 2, 3, 4]]}'.ljust(MIB)
    request = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (path, len(body), body))
    cut = request.index(b"\r\n\r\n") + 4 + 256 * 1024
    return request[:cut], request[cut:]


def answers_of(socks: list[socket.socket], at_least: int) -> dict[socket.socket, bytes]:
    """The first bytes of the answers on ``socks``, once ``at_least`` of them have one."""
    answered: dict[socket.socket, bytes] = {}
    deadline = time.monotonic() + WAIT_S
    while len(answered) < at_least and time.monotonic() < deadline:
        ready, _, _ = select.select([s for s in socks if s not in answered], [], [], 0.1)
        for sock in ready:
            answered[sock] = sock.recv(65536)
    return answered


def answered(socks: list[socket.socket], count: int, status_line: bytes
             ) -> dict[socket.socket, bytes]:
    """The answers on ``socks``, once ``count`` of them have one, each with ``status_line``."""
    answers = answers_of(socks, count)
    assert len(answers) == count
    for answer in answers.values():
        assert answer.startswith(status_line), answer
    return answers


def test_bodies_still_arriving_in_one_process_are_bounded_by_max_receiving_bytes() -> None:
    """Clients that send most of a large body and wait: with room for two such bodies, the
    third and fourth get 503 busy at once, not their memory held; a small request is still
    answered meanwhile, the two held ones once their bodies end, and a new large one after."""
    with serve("--model", "linear", "--devices", "cpu", "--frontends", "1", "--max-body-bytes",
               str(MIB), "--max-receiving-bytes", str(2 * MIB)) as (_, url):
        wait_ready(url)
        start, rest = large_request()
        socks = [raw(url) for _ in range(4)]
        for sock in socks:
            sock.sendall(start)
        refused = answered(socks, 2, b"HTTP/1.1 503 Service Unavailable\r\n")
        for answer in refused.values():
            assert b"retry-after: 1\r\n" in answer.lower() and b'"type":"busy"' in answer
        assert httpx.post(url + "/predict", json={"instances": [[1, 2, 3, 4]]},
                          timeout=10).status_code == 200
        held = [sock for sock in socks if sock not in refused]
        for sock in held:
            sock.sendall(rest)
        answered(held, 2, b"HTTP/1.1 200 OK\r\n")
        for sock in socks:
            sock.close()
        assert httpx.post(url + "/predict", content=b"".join(large_request()).split(
            b"\r\n\r\n", 1)[1], timeout=10).status_code == 200
        metrics = httpx.get(url + "/metrics", timeout=10).text
        assert sample(metrics, "batchserve_rejected_total", reason="receiving") == 2
        assert sample(metrics, "batchserve_rejected_total", reason="busy") == 0  # the queue's


def test_each_front_end_bounds_its_own_arriving_bodies() -> None:
    """Two front ends with room for two bodies each: of six large requests stalled before
    their end, at least two are refused 503 busy (whichever front ends took them): on the
    inference routes and on a path a front end asks the device process's app to answer, each
    in its protocol's form."""
    with serve("--model", "linear", "--devices", "cpu", "--frontends", "2", "--max-body-bytes",
               str(MIB), "--max-receiving-bytes", str(2 * MIB)) as (_, url):
        wait_ready(url)
        socks = []
        for path in [b"/predict"] * 3 + [b"/v2/repository/index"] * 3:
            sock = raw(url)
            sock.sendall(large_request(path)[0])
            socks.append(sock)
        refused = answers_of(socks, 2)
        assert len(refused) >= 2
        for sock, answer in refused.items():
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
            v2 = socks.index(sock) >= 3
            assert (b'{"error":"request bodies still arriving' if v2 else b'"type":"busy"') \
                in answer, answer
        for sock in socks:
            sock.close()
