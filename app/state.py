"""The states parts of the server share: the server's own, and each model version's.

``ServerState``: the runtime (app/runtime.py) is its one writer; the repository hands the
object to each model version it builds, and a version reads it on every admission and health
answer. One flag in one place: a version built during the drain sees it as one built before.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass
class ServerState:
    draining: bool = False  # the server is shutting down: refuse new work, answer what is in


class ModelState(Enum):
    """A model version's state, named as Triton names them (``ServedModel.set_state``)."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


STATES = tuple(state.value for state in ModelState)
