"""HAProxy with docker/haproxy.cfg in front of two real replicas: a busy one is taken out."""

from __future__ import annotations

import asyncio
import csv
import io
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import WAIT_S, free_socket, live_server, make_settings, sample, wait_until
from tests.fakes import EchoHandler, GatedHandler

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "    server-template replica 2 batchserve:8000 resolvers docker init-addr none\n"


def loopback_config(gateway_fd: int, stats_fd: int, ports: list[int]) -> str:
    """docker/haproxy.cfg with only the binds and the server lines changed for loopback."""
    text = (ROOT / "docker" / "haproxy.cfg").read_text()
    assert "option httpchk GET /health_check" in text and TEMPLATE in text
    text = text.replace("bind :8080", f"bind fd@{gateway_fd}")
    text = text.replace("bind :8404", f"bind fd@{stats_fd}")
    servers = "".join(f"    server replica{i + 1} 127.0.0.1:{p}\n" for i, p in enumerate(ports))
    text = text.replace(TEMPLATE, servers)
    return text[: text.index("resolvers docker")]


@contextmanager
def haproxy(tmp_path: Path, ports: list[int]) -> Iterator[tuple[str, str]]:
    gateway, stats = free_socket(), free_socket()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(loopback_config(gateway.fileno(), stats.fileno(), ports))
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)],
                            pass_fds=[gateway.fileno(), stats.fileno()])
    urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in (gateway, stats)]
    gateway.close()
    stats.close()
    try:
        yield urls[0], urls[1] + "/stats;csv"
    finally:
        proc.terminate()
        proc.wait(WAIT_S)


async def server_states(client: httpx.AsyncClient, stats_url: str,
                        pool: str = "batchserve") -> dict[str, str]:
    rows = csv.DictReader(io.StringIO((await client.get(stats_url)).text.lstrip("# ")))
    return {r["svname"]: r["status"] for r in rows if r["pxname"] == pool}


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
async def test_busy_replica_gets_no_traffic(tmp_path: Path) -> None:
    busy_handler, ok_handler = GatedHandler(), EchoHandler()
    small = make_settings(queue_capacity=2, max_instances=2)  # A: easy to fill
    with live_server(small, busy_handler) as a, live_server(make_settings(), ok_handler) as b:
        async with httpx.AsyncClient(timeout=60) as client:
            # Saturate replica A directly: one request on its device, two items filling its queue.
            held = [asyncio.create_task(client.post(a.url + "/predict", json={"instances": [0]}))]
            await wait_until(busy_handler.entered.is_set, "A's device busy")
            held.append(asyncio.create_task(
                client.post(a.url + "/predict", json={"instances": [1, 2]})))
            await wait_until(lambda: a.app.state.service.status == "busy", "A busy")

            ports = [int(s.url.rsplit(":", 1)[1]) for s in (a, b)]
            with haproxy(tmp_path, ports) as (gateway, stats):
                async def states() -> dict[str, str]:
                    try:
                        return await server_states(client, stats)
                    except httpx.TransportError:
                        return {}

                current: dict[str, str] = {}

                async def a_down_b_up() -> bool:
                    current.update(await states())
                    return current.get("replica1") == "DOWN" and current.get("replica2") == "UP"

                await wait_until(a_down_b_up, "HAProxy marks A down")
                a_busy_before = _busy(a)

                async def one(i: int) -> httpx.Response:
                    return await client.post(gateway + "/predict", json={"instances": [i]})

                responses = await asyncio.gather(*(one(i) for i in range(100, 140)))
                assert [r.status_code for r in responses] == [200] * 40
                assert [r.json()["predictions"] for r in responses] == [
                    [2.0 * i] for i in range(100, 140)]
                assert _busy(a) == a_busy_before  # nothing was even offered to A
                assert sorted(ok_handler.seen) == [float(i) for i in range(100, 140)]

                busy_handler.gate.set()  # A drains its queue and turns ready again
                assert [(await t).status_code for t in held] == [200, 200]

                async def a_up() -> bool:
                    return (await states()).get("replica1") == "UP"

                await wait_until(a_up, "HAProxy puts A back")
                responses = await asyncio.gather(*(one(i) for i in range(200, 240)))
                assert [r.status_code for r in responses] == [200] * 40
                assert any(x >= 200 for x in busy_handler.seen)  # A gets traffic again


def _busy(srv: object) -> float:
    return sample(srv.app.state.service.metrics.registry,  # type: ignore[attr-defined]
                  "batchserve_rejected_total", reason="busy")


def two_model_repository(root: Path, capacity: int) -> Path:
    """Models 'minilm' (a gated echo under the name the gateway pools) and 'other' (an echo)."""
    models = (("minilm", "tests.fakes:GatedHandler"), ("other", "tests.fakes:EchoHandler"))
    for name, model in models:
        (root / name).mkdir(parents=True)
        (root / name / "config.toml").write_text(
            f'model = "{model}"\nqueue_capacity = {capacity}\nmax_instances = 2\n')
    return root


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
async def test_a_busy_model_leaves_only_its_own_pool(tmp_path: Path) -> None:
    """Replica A's minilm queue is full: A leaves the minilm pool but stays in the default one
    (its other model can take requests), minilm's requests all go to B, and A comes back to the
    pool once it has drained."""
    settings = {"max_instances": 2, "default_model": "other"}
    repo_a = two_model_repository(tmp_path / "a", capacity=2)
    repo_b = two_model_repository(tmp_path / "b", capacity=64)
    with live_server(make_settings(model_repository=str(repo_a), **settings)) as a, \
            live_server(make_settings(model_repository=str(repo_b), **settings)) as b:
        gated = [srv.app.state.service.repository.get("minilm").handler for srv in (a, b)]
        gated[1].gate.set()
        async with httpx.AsyncClient(timeout=60) as client:
            held = [asyncio.create_task(
                client.post(a.url + "/models/minilm/predict", json={"instances": [0]}))]
            await wait_until(gated[0].entered.is_set, "A's minilm on the device")
            held.append(asyncio.create_task(
                client.post(a.url + "/models/minilm/predict", json={"instances": [1, 2]})))
            minilm_a = a.app.state.service.repository.get("minilm")
            await wait_until(lambda: minilm_a.health == "busy", "A's minilm busy")
            assert a.app.state.service.status == "ready"  # its other model can take requests

            ports = [int(s.url.rsplit(":", 1)[1]) for s in (a, b)]
            with haproxy(tmp_path, ports) as (gateway, stats):
                async def pools(a_in_minilm: str) -> bool:
                    try:
                        pool = await server_states(client, stats, "pool_minilm")
                        default = await server_states(client, stats)
                    except httpx.TransportError:
                        return False
                    return (pool.get("replica1") == a_in_minilm and pool.get("replica2") == "UP"
                            and default.get("replica1") == "UP")

                await wait_until(lambda: pools("DOWN"), "A out of the minilm pool only")
                minilm = await asyncio.gather(*(client.post(
                    gateway + "/models/minilm/predict", json={"instances": [i]})
                    for i in range(100, 120)))
                assert [r.status_code for r in minilm] == [200] * 20
                assert sorted(gated[1].seen) == [float(i) for i in range(100, 120)]  # all on B
                assert not any(x >= 100 for x in gated[0].seen)

                gated[0].gate.set()  # A drains its minilm queue
                assert [(await t).status_code for t in held] == [200, 200]
                await wait_until(lambda: pools("UP"), "A back in the minilm pool")
                both = await asyncio.gather(*(client.post(
                    gateway + f"/models/{name}/predict", json={"instances": [i]})
                    for i in range(20) for name in ("minilm", "other")))
                assert [r.status_code for r in both] == [200] * 40
