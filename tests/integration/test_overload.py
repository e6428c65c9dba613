"""Ten times the server's capacity, open loop, from outside: every request is answered exactly
once (200, 503 + Retry-After, or 504), none waits much past its deadline, memory stays bounded,
and afterwards the server is ready and as fast as before."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import WAIT_S, sample, serve, wait_ready, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

SLEEP_S = 0.1  # per model call
MAX_BATCH = 2  # capacity: MAX_BATCH / SLEEP_S = 20 items/s
TIMEOUT_S = 1.0
RATE = 200  # requests/s offered: 10 x capacity
SECONDS = 3.0
BODY = {"instances": [[1.0, 2.0]]}
# How long answers take is bounded by the server's own histogram (``in_time_of_timed``). What
# the client measures also holds its own event loop and connection set-up on the same loaded
# cores (1.8 s past a 1 s deadline on two calm cores, 5.2 s once in CI, where the server answered
# each request within 1 s), so it bounds nothing; a request that hangs fails on the client's
# timeout (WAIT_S). The server's clock starts at a request's headers, so each request is sent
# in one write (``post``): a client that yields between its headers and its body (httpx does,
# once for each) keeps the server waiting for the body, 2.0-2.3 s on cores kept busy beside.
T = TypeVar("T")


@dataclass
class Answer:
    status_code: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


async def post(url: str, body: Any, headers: dict[str, str] | None = None,
               timeout: float = WAIT_S) -> Answer:
    """POST ``body`` as JSON to /predict on a connection of its own, the whole request in one
    write; TimeoutError after ``timeout`` seconds, the connection then closed (the client
    leaves)."""
    where = urlsplit(url)
    assert where.hostname is not None and where.port is not None
    data = json.dumps(body).encode()
    lines = ["POST /predict HTTP/1.1", f"Host: {where.netloc}", "Connection: close",
             "Content-Type: application/json", f"Content-Length: {len(data)}",
             *(f"{name}: {value}" for name, value in (headers or {}).items())]
    async with asyncio.timeout(timeout):  # the connect too, as httpx's timeout
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        try:
            writer.write("\r\n".join(lines).encode() + b"\r\n\r\n" + data)
            raw = await reader.read()  # to the end: the server closes after its answer
        finally:
            writer.close()
    head, _, content = raw.partition(b"\r\n\r\n")
    status, *fields = head.decode("latin-1").split("\r\n")
    pairs = (field.split(":", 1) for field in fields)
    return Answer(int(status.split()[1]), {k.strip().lower(): v.strip() for k, v in pairs},
                  content)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def timed_post(url: str) -> tuple[Answer, float]:
    started = time.monotonic()
    response = await post(url, BODY)
    return response, time.monotonic() - started


async def lone_latencies(url: str, n: int = 5) -> list[float]:
    out = []
    for _ in range(n):
        response, seconds = await timed_post(url)
        assert response.status_code == 200
        out.append(seconds)
    return out


async def open_loop(send: Callable[[int], Awaitable[T]]) -> list[T]:
    """``send(i)`` at RATE per second for SECONDS, whatever the answers: arrivals do not wait."""
    tasks = []
    start = time.monotonic()
    for i in range(int(RATE * SECONDS)):
        delay = start + i / RATE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(i)))
    return await asyncio.gather(*tasks)


async def drained(client: httpx.AsyncClient) -> bool:
    """Nothing in flight and nothing queued, as the server's metrics say."""
    text = (await client.get("/metrics")).text
    return (sample(text, "batchserve_in_flight_requests") == 0
            and sample(text, "batchserve_queue_depth") == 0)


def in_time_of_timed(metrics: str) -> tuple[float, float]:
    """(requests the server answered within the duration bucket that holds TIMEOUT_S + 1 s,
    requests its duration histogram holds)."""
    return (sample(metrics, "batchserve_request_duration_seconds_bucket", le="2.5"),
            sample(metrics, "batchserve_request_duration_seconds_count"))


async def test_ten_times_capacity_is_answered_once_and_recovers() -> None:
    args = ("--model", "tests.fakes:sleep_module", "--devices", "cpu",
            "--max-batch-size", str(MAX_BATCH), "--queue-capacity", "8", "--max-instances", "2",
            "--request-timeout-s", str(TIMEOUT_S), "--log-level", "warning")
    with serve(*args, env={"SLEEP_S": str(SLEEP_S)}) as (proc, url):
        wait_ready(url)
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
            idle = await lone_latencies(url)
            rss_before = rss_bytes(proc.pid)

            answers = await open_loop(lambda _: timed_post(url))

            rss_after = rss_bytes(proc.pid)
            await wait_until(lambda: drained(client), "queue drained")
            health = await client.get("/health_check")
            text = (await client.get("/metrics")).text
            after = await lone_latencies(url)

    sent = len(answers)
    statuses = [r.status_code for r, _ in answers]
    assert set(statuses) <= {200, 503, 504}, sorted(set(statuses))
    assert statuses.count(503) > sent / 2, "the load was not an overload"
    assert statuses.count(200) > 0
    for response, _ in answers:
        if response.status_code == 200:
            assert response.json() == {"predictions": [[2.0, 4.0]]}
        else:
            assert response.json()["error"]["type"] in {"busy", "timeout"}
        if response.status_code == 503:
            assert response.headers["retry-after"] == "1"
    # exactly once: the server counted one answer per request sent, no more, no fewer
    answered = sum(sample(text, "batchserve_requests_total", status=str(s))
                   for s in (200, 503, 504))
    assert answered == sent + len(idle)
    # as the server saw it: every answer within the bucket that holds TIMEOUT_S + 1 s
    assert in_time_of_timed(text) == (answered, answered)
    assert rss_after - rss_before < 64 * 2**20, (rss_before, rss_after)
    assert health.status_code == 200 and health.json()["status"] == "ready"
    # back to idle speed: a backlog would add whole SLEEP_S model calls to each lone request
    assert statistics.median(after) < 2 * statistics.median(idle) + SLEEP_S


MIXED = {  # kind: (share of the requests in 8, headers, seconds the client waits before leaving)
    "urgent": (1, {"X-Priority": "1"}, None),
    "normal": (3, {}, None),
    "short": (2, {"X-Request-Timeout": "0.15"}, None),
    "leaves": (2, {}, 0.2),
}


async def mixed_post(url: str, kind: str, i: int) -> tuple[str, Answer | None]:
    """One request of ``kind``; the response is None where the client gave up and closed."""
    _, headers, gives_up_s = MIXED[kind]
    try:
        response = await post(url, {"instances": [[i, 1.0]]}, headers, gives_up_s or WAIT_S)
    except TimeoutError:
        return kind, None
    return kind, response


@pytest.mark.parametrize("frontends", ["1", "2"])
async def test_mixed_levels_deadlines_and_leavers_are_each_answered_once(frontends: str) -> None:
    """Five times capacity of urgent, ordinary, short-deadline and leaving clients at once: each
    answer is right or a clean refusal, the server counts each request once, the urgent fare
    better than the rest, and afterwards the server is idle and ready; with two front ends too,
    whose clients leave and time out on either while one queue holds them all."""
    args = ("--model", "tests.fakes:sleep_module", "--devices", "cpu", "--frontends", frontends,
            "--max-batch-size", str(MAX_BATCH), "--queue-capacity", "8", "--max-instances", "2",
            "--request-timeout-s", str(TIMEOUT_S), "--log-level", "warning")
    kinds = [kind for kind, (share, _, _) in MIXED.items() for _ in range(share)]
    with serve(*args, env={"SLEEP_S": str(SLEEP_S / 2)}) as (_, url):
        wait_ready(url)
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
            answers = await open_loop(lambda i: mixed_post(url, kinds[i % len(kinds)], i))
            await wait_until(lambda: drained(client), "queue drained")
            text = (await client.get("/metrics")).text
            health = await client.get("/health_check")
            after = await client.post("/predict", json={"instances": [[1.0, 1.0]]})

    ok = {kind: 0 for kind in MIXED}
    refused = {kind: 0 for kind in MIXED}  # 503 busy: no room in the queue
    for index, (kind, response) in enumerate(answers):
        if response is None:
            assert kind == "leaves"
            continue
        assert response.status_code in {200, 503, 504}, (kind, response.status_code)
        if response.status_code == 200:
            assert response.json() == {"predictions": [[2.0 * index, 2.0]]}
            ok[kind] += 1
        elif response.status_code == 503:
            assert response.json()["error"]["type"] in {"busy", "deadline"}
            assert int(response.headers["retry-after"]) >= 1
            refused[kind] += response.json()["error"]["type"] == "busy"
        else:
            assert response.json()["error"]["type"] == "timeout"
    sent = {kind: sum(k == kind for k, _ in answers) for kind in MIXED}
    left = sum(response is None for _, response in answers)
    # Once each: every answered request counted exactly once; a leaver is counted once if the
    # server saw it (as 200, 499, 503 or 504), not at all if it left before its headers were read.
    counted = sum(sample(text, "batchserve_requests_total", status=str(s))
                  for s in (200, 499, 503, 504))
    assert sample(text, "batchserve_requests_total", status="500") == 0
    assert len(answers) - left <= counted <= len(answers)
    assert in_time_of_timed(text) == (counted, counted)  # as the server saw it
    # Overloaded: ordinary requests found the queue full. How many depends on how fast this
    # client could send on loaded cores (131 of 225 were served once, on two busy cores).
    assert refused["normal"] > 0, "the load was not an overload"
    assert ok["urgent"] / sent["urgent"] > ok["normal"] / sent["normal"]
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert after.status_code == 200
