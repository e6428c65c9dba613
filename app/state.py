"""The states parts of the server share: the server's own, and each model version's; and the
status the server's health answers derive from its parts (``server_status``).

``ServerState``: the runtime (app/runtime.py) writes ``draining``, and the front ends' links
(app/bridge.py) what the front ends cannot serve; the repository hands the object to each model
version it builds, and a version reads it on every admission and health answer. One flag in
one place: a version built during the drain sees it as one built before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass
class ServerState:
    draining: bool = False  # the server is shutting down: refuse new work, answer what is in
    # Front ends (``--frontends N``) have not all started yet, each with the handlers of the
    # models served (the server reads loading meanwhile); once they have, never again
    frontends_starting: bool = False
    # (model, version) -> loading or unavailable: a front end cannot serve it (yet); that
    # version's health says so
    frontends_lack: dict[tuple[str, str], str] = field(default_factory=dict)


class ModelState(Enum):
    """A model version's state, named as Triton names them (``ServedModel.set_state``)."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


STATES = tuple(state.value for state in ModelState)


def server_status(draining: bool, broken: bool, starting: bool, ready_models: list[str]) -> str:
    """The server's health, the first that holds: draining; unhealthy (``broken``: a device
    thread died or is stuck, or no start-up model could be loaded); loading (``starting``);
    unhealthy (a ready model whose device threads are being restarted; ``ready_models``: each
    ready model version's health); busy (no ready model can take a request); ready."""
    if draining:
        return "draining"
    if broken:
        return "unhealthy"
    if starting:
        return "loading"
    if "unhealthy" in ready_models:
        return "unhealthy"
    if ready_models and all(health == "busy" for health in ready_models):
        return "busy"
    return "ready"
