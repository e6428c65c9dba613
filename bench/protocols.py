"""``python -m bench.protocols``: the instructions an HTTP protocol runs a request, in-process,
counted by valgrind's callgrind: how much of a front end's ~500 k a request (``python -m
bench.instructions``) is its HTTP protocol, and how much less a leaner one could run.

Each protocol serves one keep-alive connection on a transport of this module's (no socket, no
system call): a /predict request with mlp's body (512 numbers, one read), answered by a raw
ASGI app that reads the body and sends a small answer with its length, one request after
another on uvloop. The protocols: ``batchserve`` (uvicorn's httptools protocol as the server
runs it, with its bounds and one write an answer: app/connection.py), ``uvicorn`` (uvicorn's
own) and ``bare`` (httptools calling back into a few lines that start the app in a task with
the least ``receive`` and ``send``: no bounds, timers, checks or flow control; the least a
Python protocol on uvloop could run). Each runs in a process of its own under callgrind,
counting from after its imports and 100 requests to after ``--requests`` more: its
instructions a request. ``--timed``: each one's CPU a request in this process, not under
callgrind (rounds alternating, medians). Needs valgrind (``callgrind_control`` on the PATH).

On this box (2026-12-04): batchserve 150.8 k instructions a request (141.0 k since its callbacks
hold uvicorn's code, 37d0cce), uvicorn 120.5 k, bare 64.3 k (timed before that change: 18.3, 14.9
and 8.1 us).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httptools
import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from app.connection import protocol_for
from bench.instructions import control, counted
from bench.run import instance_for

BODY = json.dumps({"instances": [instance_for("mlp", 0)]}).encode()
REQUEST = (b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(BODY)) + BODY
ANSWER = b'{"predictions":[[0.1,0.2,0.3]]}'


async def raw(scope: Any, receive: Any, send: Any) -> None:
    """The app: reads the body, answers with its length."""
    message = await receive()
    while message.get("more_body"):
        message = await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(ANSWER))]})
    await send({"type": "http.response.body", "body": ANSWER})


class Transport(asyncio.Transport):
    """A connection that takes every write; ``answered`` resolves at the answer's body."""

    def __init__(self) -> None:
        super().__init__()
        self.answered: asyncio.Future[None] | None = None
        self.closing = False

    def write(self, data: Any) -> None:
        if bytes(data).endswith(ANSWER) and self.answered is not None:
            self.answered.set_result(None)

    def writelines(self, data: Any) -> None:
        self.write(data[-1])

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Bare(asyncio.Protocol):
    """httptools into an ASGI app with nothing else: the least a protocol in Python runs."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.app, self.loop = app, loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []  # type: ignore[var-annotated]

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                      "method": self.parser.get_method().decode(), "path": self.url.decode(),
                      "raw_path": self.url, "query_string": b"", "headers": self.headers}

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, head = b"".join(self.body), []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                head.append(b"HTTP/1.1 200 OK\r\n" + b"".join(
                    name + b": " + value + b"\r\n" for name, value in message["headers"])
                    + b"\r\n")
            else:
                self.transport.writelines([head[0], message["body"]])

        self.loop.create_task(self.app(self.scope, receive, send))


def protocol(name: str, loop: asyncio.AbstractEventLoop) -> asyncio.Protocol:
    if name == "bare":
        return Bare(raw, loop)
    config = Config(raw, log_config=None, ws="none", limit_concurrency=1000,
                    proxy_headers=False)
    config.load()
    cls = protocol_for(30.0) if name == "batchserve" else HttpToolsProtocol
    return cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)


async def serve(name: str, requests: int, rounds: int = 1) -> float:
    """``rounds`` of ``requests`` one after another on one connection; the CPU a request of
    the last, us. Between rounds (``rounds`` > 1) it says so on stdout and waits for a line on
    stdin (``per_request``)."""
    loop = asyncio.get_running_loop()
    served, transport = protocol(name, loop), Transport()
    served.connection_made(transport)
    for round_ in range(rounds):
        if round_:
            print("served", flush=True)
            await loop.run_in_executor(None, sys.stdin.readline)
        started = time.process_time()
        for _ in range(requests):
            transport.answered = loop.create_future()
            served.data_received(REQUEST)
            await transport.answered
    return (time.process_time() - started) / requests * 1e6


def per_request(name: str, requests: int) -> float:
    """``name``'s instructions a request under callgrind: counting on, after its imports and
    a first round, for a second round of ``requests``."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        child = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out}", sys.executable, "-m", "bench.protocols",
             "--serve", name, str(requests)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert child.stdin is not None and child.stdout is not None
        child.stdout.readline()  # its first round is served
        control([child.pid], "-i", "on")
        control([child.pid], "-z")
        child.stdin.write("go\n")
        child.stdin.flush()
        child.stdout.readline()  # the counted round is served
        control([child.pid], "-d")
        child.stdin.write("go\n")
        child.stdin.close()
        child.wait(timeout=120)
        return counted(Path(folder), "out.*") / requests


NAMES = ("batchserve", "uvicorn", "bare")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.protocols",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--serve", nargs=2, metavar=("NAME", "REQUESTS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=400, help="requests counted (400)")
    parser.add_argument("--protocols", default=",".join(NAMES),
                        help=f"which, comma-separated ({','.join(NAMES)})")
    parser.add_argument("--timed", action="store_true", help="CPU a request, not instructions")
    parser.add_argument("--rounds", type=int, default=5, help="--timed's rounds")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.serve:  # counted's child: a first round, the counted one, then a word to end
        uvloop.run(serve(args.serve[0], int(args.serve[1]), rounds=3))
        return 0
    names = [name for name in args.protocols.split(",") if name]
    if not set(names) <= set(NAMES):
        parser.error(f"--protocols: of {', '.join(NAMES)}")
    if args.timed:
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                times[name].append(uvloop.run(serve(name, 20_000)))
        for name in names:
            print(f"{name}: {statistics.median(times[name]):.2f} us a request (median of "
                  f"{args.rounds})")
        return 0
    for name in names:
        print(f"{name}: {per_request(name, args.requests):,.0f} instructions a request",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
