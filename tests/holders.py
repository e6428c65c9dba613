"""What keeps an object alive: for the message of a test that expected it freed."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

# Where a chain of referrers stops: a root of what stays alive, or past where it explains much.
DEPTH = 8
CHAINS = 6


def describe(obj: Any) -> str:
    if isinstance(obj, types.FrameType):
        return f"frame {obj.f_code.co_name} ({obj.f_code.co_filename}:{obj.f_lineno})"
    if isinstance(obj, types.CellType):
        return "closure cell"
    if isinstance(obj, types.FunctionType | types.MethodType):
        return f"{type(obj).__name__} {obj.__qualname__}"
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    return type(obj).__qualname__


def via(holder: Any, held: Any) -> str:
    """Where ``holder`` keeps ``held``, where that has a name: a frame's local, a dict's key."""
    if isinstance(holder, types.FrameType):
        names = [name for name, value in holder.f_locals.items() if value is held]
    elif isinstance(holder, dict):
        names = [repr(k) for k, value in holder.items() if value is held][:3]
    else:
        return ""
    return f" [{', '.join(names)}]" if names else ""


def holders(obj: Any) -> str:
    """For each referrer of ``obj`` (up to CHAINS), the shortest chain of referrers to it
    (``frame f -> dict -> Slot -> obj``) from a frame running on some thread, a module or a
    class, or from DEPTH steps away, found breadth-first after a collection. A frame that has
    returned is no root: what holds it is (a traceback, an exception, a log record)."""
    gc.collect()
    ours = sys._getframe()
    caller = ours.f_back  # holds ``obj`` as the argument it passes: no holder of interest
    running = set()
    for top in sys._current_frames().values():
        frame: types.FrameType | None = top
        while frame is not None:
            running.add(id(frame))
            frame = frame.f_back
    nodes: dict[int, Any] = {id(obj): obj}
    parent: dict[int, int | None] = {id(obj): None}
    branch: dict[int, int] = {}  # the referrer of obj each node was reached through
    frontier: list[int] = [id(obj)]
    roots: dict[int, int] = {}  # branch -> the first root found through it
    for _ in range(DEPTH):
        found: list[int] = []
        for key in frontier:
            if branch.get(key) in roots:
                continue
            for ref in gc.get_referrers(nodes[key]):
                if (id(ref) in parent or ref is nodes or ref is frontier or ref is found
                        or ref is ours or ref is parent or ref is caller
                        or getattr(ref, "cr_frame", None) is caller):
                    continue
                if key == id(obj) and len(branch) >= CHAINS:
                    break
                nodes[id(ref)], parent[id(ref)] = ref, key
                branch[id(ref)] = branch.get(key, id(ref))
                if id(ref) in running or isinstance(ref, types.ModuleType | type):
                    roots.setdefault(branch[id(ref)], id(ref))
                else:
                    found.append(id(ref))
        frontier = found
    for key in frontier:  # DEPTH steps away, on the branches that met no root
        roots.setdefault(branch[key], key)

    def chain(key: int | None) -> str:
        steps = []
        while key is not None:
            held = parent[key]
            steps.append(describe(nodes[key]) + (via(nodes[key], nodes[held])
                                                 if held is not None else ""))
            key = held
        return " -> ".join(steps)

    found_chains = "\n".join(chain(key) for key in roots.values()) or (
        "by nothing the collector sees: frozen objects (gc.freeze: "
        f"{gc.get_freeze_count()} now), a running frame's stack, or C code")
    nodes.clear()
    return f"{describe(obj)} is still held:\n{found_chains}"
