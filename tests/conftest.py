"""Settings factory, in-process app client, and a real uvicorn server on a free loopback port."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from asgi_lifespan import LifespanManager

from app.config import Settings
from app.main import create_app
from app.models.base import ModelHandler

WAIT_S = 60.0  # upper bound for waiting on a condition; never a timing assertion
ROOT = Path(__file__).resolve().parents[1]


def make_settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "model": "linear", "devices": "cpu", "max_batch_size": 32, "max_wait_ms": 5,
        "queue_capacity": 64, "request_timeout_s": 30, "max_instances": 16,
    }
    base.update(overrides)
    return Settings(**base)


@pytest.fixture
def settings_factory() -> Callable[..., Settings]:
    return make_settings


async def wait_until(predicate: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def wait_until_sync(predicate: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


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


def free_socket() -> socket.socket:
    """A listening TCP socket on 127.0.0.1, port chosen by the kernel."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)  # uvicorn's own default backlog
    return sock


class LiveServer:
    def __init__(self, app: Any, server: uvicorn.Server, url: str) -> None:
        self.app = app
        self.server = server
        self.url = url


@contextmanager
def live_server(settings: Settings, handler: ModelHandler | None = None) -> Iterator[LiveServer]:
    """A real uvicorn server in a thread on a free loopback port, model ready."""
    app = create_app(settings, handler)
    sock = free_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, lifespan="on", timeout_graceful_shutdown=30)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until_sync(lambda: server.started, "server started")
        wait_until_sync(
            lambda: app.state.service is not None and app.state.service.status == "ready",
            "model ready",
        )
        yield LiveServer(app, server, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


@contextmanager
def serve(
    *args: str, env: dict[str, str] | None = None, stderr: int | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m app serve`` as a real process on an inherited socket bound to a free
    loopback port; killed on exit if still running."""
    sock = free_socket()
    port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--fd", str(sock.fileno()), *args],
        cwd=ROOT, pass_fds=[sock.fileno()], stderr=stderr,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )
    sock.close()
    url = f"http://127.0.0.1:{port}"
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT_S)
        if proc.stderr is not None:
            proc.stderr.close()


def wait_ready(url: str) -> None:
    def ready() -> bool:
        try:
            return httpx.get(url + "/health_check", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_until_sync(ready, "server ready")


def metric(text: str, name: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0
