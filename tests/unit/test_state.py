"""``server_status``: which of the server's parts its health answer names first."""

from __future__ import annotations

import pytest

from app.state import server_status


@pytest.mark.parametrize(("draining", "broken", "starting", "ready_models", "status"), [
    (True, True, True, ["unhealthy"], "draining"),  # a drain says so whatever else holds
    (False, True, True, ["ready"], "unhealthy"),  # a dead device thread over a start-up
    (False, False, True, ["unhealthy"], "loading"),
    (False, False, False, ["ready", "unhealthy"], "unhealthy"),  # a model being re-attached
    (False, False, False, ["busy", "busy"], "busy"),
    (False, False, False, ["busy", "ready"], "ready"),  # one model can still take requests
    (False, False, False, [], "ready"),  # explicit mode, nothing loaded yet
])
def test_the_first_state_that_holds_is_the_servers(draining: bool, broken: bool, starting: bool,
                                                   ready_models: list[str], status: str) -> None:
    assert server_status(draining, broken, starting, ready_models) == status
