"""app/accepting.py: every connection waiting is accepted when the socket is readable, on
uvloop (whose own server takes one a pass of the loop) and on the standard library's loop."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from app.accepting import Acceptor

ROOT = Path(__file__).resolve().parents[2]
LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {
    "uvloop": uvloop.run, "asyncio": asyncio.run}


class Made(asyncio.Protocol):
    """Records each connection made, and the pass of the loop it was made in."""

    made: list[tuple[int, asyncio.BaseTransport]] = []
    passes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Made.made.append((Made.passes, transport))


async def burst(count: int) -> tuple[int, list[int], list[int]]:
    """``count`` clients connected before the acceptor starts, beside a callback that runs
    once a pass of the loop: (the pass it started in, each connection's pass, and its socket's
    TCP_NODELAY)."""
    Made.made, Made.passes = [], 0
    loop = asyncio.get_running_loop()

    def tick() -> None:
        Made.passes += 1
        loop.call_soon(tick)

    listener = socket.create_server(("127.0.0.1", 0), backlog=count)
    clients = [socket.create_connection(listener.getsockname()) for _ in range(count)]
    loop.call_soon(tick)
    await asyncio.sleep(0)
    started = Made.passes
    acceptor = Acceptor(listener, Made)
    try:
        for _ in range(2000):
            if len(Made.made) == count:
                break
            await asyncio.sleep(0)
        return (started, [n for n, _ in Made.made],
                [t.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                 for _, t in Made.made])
    finally:
        for _, transport in Made.made:
            transport.close()
        acceptor.close()
        for client in clients:
            client.close()
        await asyncio.sleep(0)  # the transports' close


@pytest.mark.parametrize("loop", LOOPS)
def test_a_burst_of_connections_is_accepted_in_one_pass_of_the_loop(loop: str) -> None:
    """64 connections waiting are all the loop's within a few passes, not one a pass."""
    started, passes, _ = LOOPS[loop](burst(64))
    assert len(passes) == 64
    assert max(passes) - started <= 4


@pytest.mark.parametrize("loop", LOOPS)
def test_each_connection_has_nagles_algorithm_off(loop: str) -> None:
    """TCP_NODELAY, as the loop's own server sets it: a small answer is not held back waiting
    for the client's delayed acknowledgement."""
    _, _, nodelay = LOOPS[loop](burst(3))
    assert nodelay == [1] * 3


def test_once_closed_the_port_refuses_connections() -> None:
    async def main() -> tuple[int, int]:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        Acceptor(listener, Made).close()
        return port, listener.fileno()

    port, fileno = uvloop.run(main())
    assert fileno == -1
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_out_of_descriptors_the_connections_waiting_are_closed_not_held() -> None:
    """A process that has run out of descriptors closes the connections it cannot take, so
    that their clients learn at once (libuv's way; the standard library's loop leaves them in
    the backlog), and accepts again once descriptors are free."""
    script = textwrap.dedent("""
        import asyncio, resource, socket, sys, uvloop
        from app.accepting import Acceptor

        class Hello(asyncio.Protocol):
            def connection_made(self, transport):
                transport.write(b"hi")

        async def main():
            loop = asyncio.get_running_loop()
            line = lambda: loop.run_in_executor(None, sys.stdin.readline)
            listener = socket.create_server(("127.0.0.1", 0))
            acceptor = Acceptor(listener, Hello)
            await asyncio.sleep(0)  # the executor's thread, before descriptors run out
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
            held = []
            try:
                while True:
                    held.append(open("/dev/null"))
            except OSError:  # every descriptor taken
                pass
            print(listener.getsockname()[1], flush=True)
            await line()  # a client connects meanwhile, and is closed
            for f in held:
                f.close()
            print("free", flush=True)
            await line()  # the next one is accepted
            acceptor.close()

        uvloop.run(main())
    """)
    with subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            port = int(proc.stdout.readline())
            with socket.create_connection(("127.0.0.1", port), timeout=10) as refused:
                assert refused.recv(2) == b""  # closed; left in the backlog, it would time out
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "free\n"
            with socket.create_connection(("127.0.0.1", port), timeout=10) as taken:
                assert taken.recv(2) == b"hi"
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.wait(timeout=10) == 0
        finally:
            proc.kill()
