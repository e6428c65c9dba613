"""The hop between front ends and the device process, alone: which transport (docs/frontends.md).

One "front end" process sends messages of ``--per-message`` requests, each one float32 item of
``--width`` values, keeping ``--window`` messages in flight; the "device" process answers each
request with 16 float32 values. Printed: requests per second and each side's CPU per request.

    python -m bench.ipc                    # every transport, default sizes
    python -m bench.ipc --transport unix --per-message 1

Transports: ``unix`` (a socketpair read and written as the front ends and the device process do,
app/links.py: one pickle per message with the arrays' bytes as protocol-5 out-of-band frames,
app/wire.py) and ``zmq``
(pyzmq's asyncio PAIR socket, the same pickle, the frames as zmq message parts), when pyzmq is
installed.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import pickle
import socket
import time
from typing import Any

import numpy as np

from app import wire
from app.links import connect


def write_message(transport: asyncio.WriteTransport, obj: Any) -> None:
    transport.writelines(wire.encode(obj))


def _device_unix(sock: socket.socket, q: Any) -> None:
    import uvloop

    async def main() -> None:
        inbox, transport = await connect(sock)
        out = np.zeros(16, dtype=np.float32)
        start = time.process_time()
        try:
            while True:
                msg = await inbox.read()
                if msg is None:
                    break
                write_message(transport, [(rid, out) for rid, _ in msg])
        except ConnectionError:
            pass
        q.put(time.process_time() - start)

    uvloop.run(main())


def _device_zmq(address: str, q: Any) -> None:
    import uvloop
    import zmq
    import zmq.asyncio

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        s = ctx.socket(zmq.PAIR)
        s.connect(address)
        out = np.zeros(16, dtype=np.float32)
        start = time.process_time()
        while True:
            parts = await s.recv_multipart(copy=False)
            head, *bufs = parts
            msg = pickle.loads(head.buffer, buffers=[b.buffer for b in bufs])
            if msg is None:
                break
            frames: list[pickle.PickleBuffer] = []
            reply = pickle.dumps([(rid, out) for rid, _ in msg], protocol=5,
                                 buffer_callback=frames.append)
            await s.send_multipart([reply, *(f.raw() for f in frames)], copy=False)
        q.put(time.process_time() - start)
        s.close(linger=0)
        ctx.term()

    uvloop.run(main())


async def _front(send: Any, recv: Any, close: Any, messages: int, per: int, width: int,
                 window: int) -> tuple[float, float]:
    item = np.ones(width, dtype=np.float32)
    rid = 0

    def message() -> list[tuple[int, np.ndarray]]:
        nonlocal rid
        rid += per
        return [(rid + i, item.copy()) for i in range(per)]

    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(window):
        await send(message())
    for done in range(messages):
        reply = await recv()
        assert len(reply) == per
        if done + window < messages:
            await send(message())
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    await close()
    return elapsed, cpu


def run(transport: str, messages: int, per: int, width: int, window: int) -> dict[str, float]:
    import uvloop

    q: Any = mp.get_context("fork").Queue()
    if transport == "unix":
        a, b = socket.socketpair()
        proc = mp.get_context("fork").Process(target=_device_unix, args=(b, q))
        proc.start()
        b.close()

        async def front() -> tuple[float, float]:
            inbox, transport = await connect(a)

            async def send(obj: Any) -> None:
                write_message(transport, obj)

            async def recv() -> Any:
                return await inbox.read()

            async def close() -> None:
                write_message(transport, None)
                transport.close()

            return await _front(send, recv, close, messages, per, width, window)
    else:
        import zmq
        import zmq.asyncio

        address = f"ipc:///tmp/bench-ipc-{time.monotonic_ns()}"
        ctx = zmq.asyncio.Context()
        s = ctx.socket(zmq.PAIR)
        s.bind(address)
        proc = mp.get_context("fork").Process(target=_device_zmq, args=(address, q))
        proc.start()

        async def front() -> tuple[float, float]:
            async def send(obj: Any) -> None:
                frames: list[pickle.PickleBuffer] = []
                head = pickle.dumps(obj, protocol=5, buffer_callback=frames.append)
                await s.send_multipart([head, *(f.raw() for f in frames)], copy=False)

            async def recv() -> Any:
                head, *bufs = await s.recv_multipart(copy=False)
                return pickle.loads(head.buffer, buffers=[b.buffer for b in bufs])

            async def close() -> None:
                await send(None)

            return await _front(send, recv, close, messages, per, width, window)

    elapsed, front_cpu = uvloop.run(front())
    device_cpu = q.get(timeout=60)
    proc.join(10)
    n = messages * per
    return {"req_per_s": n / elapsed, "front_us": 1e6 * front_cpu / n,
            "device_us": 1e6 * device_cpu / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transport", choices=["unix", "zmq", "all"], default="all")
    p.add_argument("--per-message", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    names = ["unix", "zmq"] if a.transport == "all" else [a.transport]
    messages = max(1, a.requests // a.per_message)
    for _ in range(a.rounds):
        for name in names:
            r = run(name, messages, a.per_message, a.width, a.window)
            print(f"{name:5} per message {a.per_message:4}: {r['req_per_s']:10,.0f} req/s, "
                  f"front {r['front_us']:5.2f} us/req, device {r['device_us']:5.2f} us/req",
                  flush=True)


if __name__ == "__main__":
    main()
