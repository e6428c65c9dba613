"""How long a relayed request waits for the app's answer, and what it answers past that
(app/api/relay.py)."""

from __future__ import annotations

import asyncio

import pytest

from app.api import relay
from app.asks import Asked, Replied
from app.errors import Unavailable


@pytest.mark.parametrize(("method", "path", "limit"), [
    ("GET", "/health_check", relay.HEALTH_TIMEOUT_S),
    ("HEAD", "/v2/health/live", relay.HEALTH_TIMEOUT_S),
    ("GET", "/v2/health/ready", relay.HEALTH_TIMEOUT_S),
    ("GET", "/v2/models/m/ready", relay.HEALTH_TIMEOUT_S),
    ("GET", "/v2/models/m/versions/2/ready", relay.HEALTH_TIMEOUT_S),
    ("GET", "/metrics", relay.ASK_TIMEOUT_S),
    ("GET", "/v2/models/m", relay.ASK_TIMEOUT_S),
    ("GET", "/nowhere", relay.ASK_TIMEOUT_S),
    ("POST", "/v2/repository/index", relay.ASK_TIMEOUT_S),
    ("GET", "/v2/repository/models/m/load", relay.ASK_TIMEOUT_S),  # a 405, not a load
    ("POST", "/v2/repository/models/m/load", None),
    ("POST", "/v2/repository/models/m/unload", None),
])
def test_probes_wait_seconds_loads_as_long_as_they_take_the_rest_a_bound(
        method: str, path: str, limit: float | None) -> None:
    assert relay.proxy_timeout(method, path) == limit


def asked(method: str, path: str) -> Asked:
    return Asked(method, path, path.encode(), b"", [], None, b"")


@pytest.mark.asyncio
async def test_an_answer_not_given_in_time_is_503_unhealthy_naming_the_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A held app: a probe and a metadata request are each answered 503 unhealthy after their
    own limit; a load waits past both and gets the app's answer."""
    monkeypatch.setattr(relay, "HEALTH_TIMEOUT_S", 0.02)
    monkeypatch.setattr(relay, "ASK_TIMEOUT_S", 0.05)
    done = asyncio.Event()

    async def app(request: Asked) -> Replied:
        await done.wait()
        return Replied(200, [], b"{}")

    relayed = relay.Relay(app)
    for path, seconds in (("/v2/health/ready", 0.02), ("/v2/models/m", 0.05)):
        with pytest.raises(Unavailable) as refused:
            await relayed(asked("GET", path))
        assert (refused.value.status, refused.value.type) == (503, "unhealthy")
        assert str(refused.value) == f"the device process did not answer within {seconds:g} s"
    load = asyncio.ensure_future(relayed(asked("POST", "/v2/repository/models/m/load")))
    await asyncio.sleep(0.1)
    assert not load.done()
    done.set()
    assert (await load).status == 200
