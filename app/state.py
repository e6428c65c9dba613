"""The states parts of the server share: the server's own, and each model version's.

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
