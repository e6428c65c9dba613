"""ServerState: what every part of one server reads and one part writes.

The runtime (app/runtime.py) is the one writer; the repository hands the object to each model
version it builds, and a version reads it on every admission and health answer. One flag in one
place: a version built during the drain sees it as one built before.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerState:
    draining: bool = False  # the server is shutting down: refuse new work, answer what is in
