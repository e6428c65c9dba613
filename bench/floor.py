"""The HTTP floor: what uvicorn (httptools, uvloop) alone does on this machine.

``python -m bench.floor``: a raw ASGI app that reads the body and returns a fixed answer, served
by the same uvicorn as batchserve, driven by the same wrk script and body as ``python -m bench
--workload linear``. No serving stack can beat this number, so it is the reference for the
`linear` targets.

``python -m bench.floor --group 8``: the same for a closed loop on ``mlp``. The raw app holds
requests until eight are waiting and hands them to one thread that runs the real model on a batch
of eight (the server's own device code) and resolves them: the fixed shape (uvicorn, an event
loop, a device thread) with none of batchserve's work. Rounds alternate offline at batch 8, this
floor and batchserve at concurrency 8, and the medians of the ratios show how much of the gap to
offline is the shape's and how much is batchserve's. ``--decode`` makes the floor parse and
decode every body as batchserve must. ``--group 32 --concurrency 64`` measures the saturated case
the same way: two batches' worth of clients, so the next batch waits while one computes.

``python -m bench.floor --stacks``: what an HTTP stack costs a request, the CPU of the server's
process a request with mlp's body (512 numbers) and a small answer at ``--concurrency`` (32, a
front end's share of c=256 at 8): a bare protocol on uvloop, httptools parsing and one write
an answer (no ASGI, no keep-alive timer, no checks: the least any Python server on uvloop
spends), uvicorn with the raw app (two writes an answer), uvicorn with only batchserve's cycles
(each answer in one write, its head made at less cost: ``Cycle``, app/cycle.py), and uvicorn
with batchserve's protocol (those cycles and its bounds on slow, large and pipelined requests),
rounds alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import statistics
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.connection import protocol_for
from app.cycle import Cycle
from bench.run import (
    answered_s,
    body_file,
    build_parser,
    cpu_seconds,
    instance_for,
    listening,
    offline_items_s,
    run_wrk,
    server,
)

ANSWER = b'{"predictions":[[0.1,0.2]]}'
BARE_ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
               + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)  # --stacks' bare server
GROUP_ENV = "BENCH_FLOOR_GROUP"
DECODE_ENV = "BENCH_FLOOR_DECODE"


async def read_all(receive: Any) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def answer(send: Any, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await read_all(receive)
    await answer(send, ANSWER)


def grouped_app() -> Callable[..., Any]:
    """The ``--group`` floor (a uvicorn factory): ``$BENCH_FLOOR_GROUP`` requests per `mlp`
    batch, bodies parsed and decoded when ``$BENCH_FLOOR_DECODE`` is 1."""
    import torch

    from app.models.registry import load_handler
    from app.transfer import DeviceExecutor

    group = int(os.environ[GROUP_ENV])
    decode = os.environ.get(DECODE_ENV) == "1"
    torch.set_num_threads(1)
    handler = load_handler("mlp")
    replica = handler.load(torch.device("cpu"))
    executor = DeviceExecutor(torch.device("cpu"))
    fixed = handler.decode([instance_for("mlp", i) for i in range(group)])
    batches: queue.SimpleQueue[tuple[list[asyncio.Future[Any]], list[Any]]] = queue.SimpleQueue()
    waiting: list[tuple[asyncio.Future[Any], list[Any]]] = []
    loop: asyncio.AbstractEventLoop | None = None

    def resolve(futures: list[asyncio.Future[Any]], results: list[Any]) -> None:
        for future, result in zip(futures, results, strict=True):
            future.set_result(result)

    def device() -> None:
        torch.get_num_threads()  # this thread's OpenMP count, as DeviceExecutor's thread does
        while True:
            futures, items = batches.get()
            results, _ = executor.launch(handler, replica, items).wait()
            assert loop is not None
            loop.call_soon_threadsafe(resolve, futures, results)

    threading.Thread(target=device, daemon=True).start()

    async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal loop
        if scope["type"] != "http":
            return
        body = await read_all(receive)
        if scope["method"] != "POST":  # readiness
            await answer(send, ANSWER)
            return
        loop = asyncio.get_running_loop()
        items = handler.decode(orjson.loads(body)["instances"]) if decode else []
        future = loop.create_future()
        waiting.append((future, items))
        if len(waiting) == group:
            batch = [item for _, its in waiting for item in its] if decode else fixed
            batches.put(([f for f, _ in waiting], batch))
            waiting.clear()
        result = await future
        await answer(send, orjson.dumps({"predictions": [result]},
                                        option=orjson.OPT_SERIALIZE_NUMPY))

    return serve


@contextmanager
def floor_server(target: str, env: dict[str, str], http: str = "httptools"
                 ) -> Iterator[tuple[str, int]]:
    """uvicorn serving ``target`` as batchserve is served: (url, pid)."""
    cmd = [sys.executable, "-m", "uvicorn", *target.split(), "--log-level", "warning",
           "--no-access-log", "--loop", "uvloop", "--http", http]
    with listening(cmd, "/", env, inherit=False) as started:
        yield started


class _Bare(asyncio.Protocol):
    """``--stacks``' bare server: each whole request answered ``ANSWER`` in one write."""

    def connection_made(self, transport: Any) -> None:
        import httptools

        self._transport = transport
        self._parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        self._transport.write(BARE_ANSWER)


def bare_server(port: int) -> None:
    import uvloop

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_Bare, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(serve())


class OneWrite(HttpToolsProtocol):
    """uvicorn's protocol with batchserve's cycles (``Cycle``: one write an answer) and nothing
    else of batchserve's: their own cost, apart from the bounds ``Served`` adds. Each cycle
    uvicorn made is made a ``Cycle`` before its task first runs (its ``run_asgi`` stays
    uvicorn's: the same on a request that succeeds)."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.cycle.__class__ = Cycle


Served = protocol_for(30.0)  # uvicorn's protocol as batchserve runs it (app/draining.py)


def stacks(concurrency: int, rounds: int, seconds: float) -> None:
    """The CPU a request of each stack (its whole process), rounds alternating; medians."""
    bare = [sys.executable, "-m", "bench.floor", "--bare-server"]
    per: dict[str, list[float]] = {}
    with body_file([instance_for("mlp", 0)]) as body, \
            listening(bare, "/", {}, inherit=False) as bare_at, \
            floor_server("bench.floor:app", {}) as uvicorn_at, \
            floor_server("bench.floor:app", {}, http="bench.floor:OneWrite") as one_at, \
            floor_server("bench.floor:app", {}, http="bench.floor:Served") as served_at:
        servers = {"bare": bare_at, "uvicorn": uvicorn_at, "uvicorn, one write": one_at,
                   "batchserve's": served_at}
        for url, _ in servers.values():
            run_wrk(url, body, concurrency, 1)  # warm up
        names = list(servers)
        for i in range(rounds):
            line = []
            for name in names[i % len(names):] + names[:i % len(names)]:  # each first in turn
                url, pid = servers[name]
                cpu0 = cpu_seconds(pid)
                r = run_wrk(url, body, concurrency, seconds)
                us = (cpu_seconds(pid) - cpu0) / r["requests"] * 1e6
                per.setdefault(name, []).append(us)
                line.append(f"{name} {answered_s(r):.0f} req/s {us:.1f} us")
            print(",  ".join(line), flush=True)
    print("medians, CPU a request: " + ", ".join(
        f"{name} {statistics.median(values):.1f} us" for name, values in per.items()))


def http_floor() -> None:
    with body_file([instance_for("linear", 0)]) as body, \
            floor_server("bench.floor:app", {}) as (url, _):
        run_wrk(url, body, 64, 2)  # warm up
        for concurrency in (1, 64):
            r = run_wrk(url, body, concurrency, 10)
            print(f"floor c={concurrency}: {answered_s(r):.0f} "
                  f"req/s, p50 {r['p50_us'] / 1000:.2f} ms", flush=True)


def grouped_floor(group: int, concurrency: int, rounds: int, seconds: float,
                  decode: bool) -> None:
    import torch

    torch.set_num_threads(1)
    env = {GROUP_ENV: str(group), DECODE_ENV: "1" if decode else "0"}
    ratios: dict[str, list[float]] = {"floor": [], "batchserve": [], "batchserve/floor": []}
    with body_file([instance_for("mlp", 0)]) as body, \
            floor_server("--factory bench.floor:grouped_app", env) as floor, \
            server("mlp", 32, build_parser().parse_args([])) as batchserve:
        for url, _ in (floor, batchserve):
            run_wrk(url, body, concurrency, 2)  # warm up
        for _ in range(rounds):
            offline = offline_items_s("mlp", group, 2.0, 1, torch.device("cpu"))
            line = [f"offline b{group} {offline:.0f} items/s"]
            got = {}
            for name, (url, pid) in (("floor", floor), ("batchserve", batchserve)):
                loop0 = cpu_seconds(pid, pid)
                r = run_wrk(url, body, concurrency, seconds)
                loop_us = (cpu_seconds(pid, pid) - loop0) / r["requests"] * 1e6
                got[name] = answered_s(r)
                ratios[name].append(got[name] / offline)
                line.append(f"{name} {got[name]:.0f} ({got[name] / offline:.2f} x, "
                            f"loop {loop_us:.0f} us)")
            ratios["batchserve/floor"].append(got["batchserve"] / got["floor"])
            print("  ".join(line), flush=True)
    print("medians: " + ", ".join(f"{name} {statistics.median(values):.3f}"
                                   for name, values in ratios.items())
          + f" (floor and batchserve at concurrency {concurrency} as x offline at batch "
            f"{group})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", type=int, default=0,
                        help="closed loop on mlp at this concurrency, batches of this size")
    parser.add_argument("--concurrency", type=int, default=0,
                        help="clients in the closed loop (default: the group; --stacks: 32)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4.0, help="per wrk run")
    parser.add_argument("--decode", action="store_true", help="the floor decodes every body")
    parser.add_argument("--stacks", action="store_true",
                        help="the CPU a request of a bare protocol, uvicorn, and uvicorn with "
                        "batchserve's protocol")
    parser.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_server:
        bare_server(args.port)
    elif args.stacks:
        stacks(args.concurrency or 32, args.rounds, args.seconds)
    elif args.group > 0:
        grouped_floor(args.group, args.concurrency or args.group, args.rounds, args.seconds,
                      args.decode)
    else:
        http_floor()


if __name__ == "__main__":
    main()
