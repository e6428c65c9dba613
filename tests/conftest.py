"""Settings factory, in-process app client, and a real uvicorn server on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from app.asks import answer
from app.config import Settings
from app.grpc.listener import GrpcListener
from app.main import create_app
from app.models.base import ModelHandler

# Upper bound for waiting on a condition; never a timing assertion. A minilm server is ready
# 18-23 s after its start on an idle 2-core box, and took past 60 s beside two test workers and
# two busy processes there.
WAIT_S = 120.0
# For servers the tests start as processes: no downloads, and no gRPC on its default (fixed)
# port unless a test asks for it on a free one.
QUIET_ENV = {"HF_HUB_OFFLINE": "1", "BATCHSERVE_GRPC_PORT": "0"}
ROOT = Path(__file__).resolve().parents[1]


def make_settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "model": "linear", "devices": "cpu", "max_batch_size": 32, "max_wait_ms": 5,
        "queue_capacity": 64, "request_timeout_s": 30, "max_instances": 16,
    }
    base.update(overrides)
    if "model_repository" in overrides:
        del base["model"]  # a repository says what to serve
    return Settings(**base)


POLL_S = 0.01


def _timed_out(deadline: float, what: str) -> bool:
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out waiting for {what}")
    return False


async def wait_until(predicate: Callable[[], Any], what: str) -> None:
    """Poll ``predicate`` (a plain or async callable) from a test's event loop, which keeps
    running meanwhile; fail after WAIT_S. Never a timing assertion."""
    deadline = time.monotonic() + WAIT_S
    while True:
        ok = predicate()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok or _timed_out(deadline, what):
            return
        await asyncio.sleep(POLL_S)


def wait_until_sync(predicate: Callable[[], Any], what: str, within_s: float = WAIT_S) -> None:
    """The same from a thread with no event loop of its own."""
    deadline = time.monotonic() + within_s
    while not predicate() and not _timed_out(deadline, what):
        time.sleep(POLL_S)


def sample(source: CollectorRegistry | str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when none):
    from an in-process registry, or from the text of a server's /metrics."""
    families = (text_string_to_metric_families(source) if isinstance(source, str)
                else source.collect())
    return sum(float(s.value) for family in families for s in family.samples
               if s.name == name and labels.items() <= s.labels.items())


def queued(holder: Any) -> int:
    """Items waiting in the default model's queue of an in-process client's app or a live
    server."""
    return int(holder.app.state.service.repository.get().queue.depth)


def http_scope(path: str, app: Any, method: str = "POST",
               headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    """An ASGI HTTP scope, for calling an app without a client."""
    return {"type": "http", "asgi": {"version": "3.0"}, "method": method, "path": path,
            "raw_path": path.encode(), "query_string": b"",
            "headers": headers or [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "scheme": "http",
            "http_version": "1.1", "root_path": "", "app": app}


@asynccontextmanager
async def app_client(
    settings: Settings, handler: ModelHandler | None = None, wait_ready: bool = True
) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process (httpx ASGITransport), lifespan running, model ready."""
    app = create_app(settings, handler)
    async with LifespanManager(app, startup_timeout=WAIT_S, shutdown_timeout=WAIT_S) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            if wait_ready:
                await wait_until(lambda: app.state.service.status == "ready", "model ready")
            client.app = app  # type: ignore[attr-defined]
            yield client


def free_socket(reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on 127.0.0.1, port chosen by the kernel; with ``reuse_port`` in
    a SO_REUSEPORT group, as the server binds its own for several front ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)  # uvicorn's own default backlog
    return sock


# Ports free_port hands out, for each pytest-xdist worker its own block below the kernel's
# ephemeral range; the count of those handed out in this process.
PORT_BLOCK = 200
_ports_given = itertools.count()


def free_port() -> int:
    """A loopback port no socket holds now, for a listener that binds by number (gRPC,
    redis-server, a job worker's metrics), or one where nothing listens. Not one
    from bind(0): released for the server to bind, it was open to every other process's bind(0)
    and connect() until the server had imported torch (the other test worker's server took
    one). So from below the ephemeral range (the kernel picks those ports from it, never below
    it), in a block of this worker's own; bind(0)'s where no such block fits."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    first = low - PORT_BLOCK * (worker + 1)
    for _ in range(PORT_BLOCK if first >= 1024 else 0):
        port = first + next(_ports_given) % PORT_BLOCK
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))  # as the server binds it first: not shared
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    def __init__(self, app: Any, server: uvicorn.Server, url: str,
                 grpc_url: str | None = None) -> None:
        self.app = app
        self.server = server
        self.url = url
        self.grpc_url = grpc_url  # host:port, when the server serves gRPC


class _WithGrpc(uvicorn.Server):
    """uvicorn's Server that also serves gRPC on its loop, as ``batchserve serve`` does."""

    def __init__(self, config: uvicorn.Config, grpc: GrpcListener | None) -> None:
        super().__init__(config)
        self.grpc = grpc

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.grpc is not None:
            await self.grpc.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.grpc is not None:
            await self.grpc.stop(1.0)
        await super().shutdown(sockets)


@contextmanager
def live_server(settings: Settings, handler: ModelHandler | None = None,
                grpc: bool = False) -> Iterator[LiveServer]:
    """A real uvicorn server in a thread on a free loopback port, model ready; ``grpc``: it
    serves gRPC too, on another free port."""
    if grpc:
        settings = settings.model_copy(update={"grpc_port": free_port()})
    app = create_app(settings, handler)
    sock = free_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, lifespan="on", timeout_graceful_shutdown=30)
    grpc_server = GrpcListener(settings, app.state.service,
                               partial(answer, app)) if grpc else None
    server = _WithGrpc(config, grpc_server)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until_sync(lambda: server.started, "server started")
        wait_until_sync(lambda: app.state.service.status == "ready", "model ready")
        yield LiveServer(app, server, f"http://127.0.0.1:{port}",
                         f"127.0.0.1:{settings.grpc_port}" if grpc else None)
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


@contextmanager
def serve(
    *args: str, env: dict[str, str] | None = None, stderr: int | None = None,
    wrap: tuple[str, ...] = (), reuse_port: bool = False,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m app serve`` as a real process on an inherited socket bound to a free
    loopback port (``reuse_port``: see ``free_socket``), started through ``wrap`` (a command
    such as strace) if given. On exit whatever is left of it is killed: its own process group,
    so a wrapped server goes too."""
    sock = free_socket(reuse_port)
    port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [*wrap, sys.executable, "-m", "app", "serve", "--fd", str(sock.fileno()), *args],
        cwd=ROOT, pass_fds=[sock.fileno()], stderr=stderr, start_new_session=True,
        env={**os.environ, **QUIET_ENV, **(env or {})},
    )
    sock.close()
    url = f"http://127.0.0.1:{port}"
    try:
        yield proc, url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(WAIT_S)
        if proc.stderr is not None:
            proc.stderr.close()


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of a served ``/metrics``."""
    return sample(httpx.get(url + "/metrics", timeout=10).text, name, **labels)


@contextmanager
def split_server(*args: str, env: dict[str, str] | None = None, stderr: int | None = None,
                 shared: bool = False) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``serve`` with two front ends (``args`` should say ``--frontends 2``), both linked to
    the device process and ready: each on its own socket of a SO_REUSEPORT group, as when
    the server binds its address itself, or with ``shared`` both on the one inherited
    socket (app/listening.py)."""
    with serve(*args, env=env, stderr=stderr, reuse_port=not shared) as (proc, url):
        wait_ready(url)
        wait_until_sync(lambda: metric(url, "batchserve_frontends_connected") == 2,
                        "two front ends linked")
        assert len(children(proc.pid)) == 2
        yield proc, url


def wait_ready(url: str) -> None:
    def ready() -> bool:
        try:
            return httpx.get(url + "/health_check", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    # The default model warms up in 18 s alone on a 2-core box, past a minute beside the
    # other test worker and more load.
    wait_until_sync(ready, "server ready", 2 * WAIT_S)




def isolated_logging(monkeypatch: pytest.MonkeyPatch) -> tuple[logging.Logger, io.StringIO]:
    """The root logger and logging's switches as they are, put back after the test (the
    tests' own level stays), and stderr a buffer: for a test of ``configure_logging``."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "setLevel", lambda level: None)
    for switch in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, switch, getattr(logging, switch))
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    return root, stream
