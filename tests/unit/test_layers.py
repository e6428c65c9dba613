"""Imports point one way: entry points -> api, grpc / jobs -> service -> repository -> worker ->
served model -> queues, transfer -> models.

A module may import modules of its own layer or below, never above; api and jobs never import
each other. Lazy imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"

LAYERS = [
    # shared, imported from anywhere
    ["app.errors", "app.values", "app.config", "app.sources", "app.state", "app.payload",
     "app.logs", "app.process", "app.schemas", "app.wire", "app.links", "app.version",
     "app.arrays", "app.arriving", "app.framing", "app.versions", "app.tasks", "app.asks",
     "app.lifetime"],
    ["app.models", "app.devices", "app.pending", "app.report", "app.bell", "app.scheduler",
     "app.tracing", "app.statistics"],
    ["app.metrics"],
    ["app.transfer", "app.queues", "app.warmup", "app.facade", "app.graphs", "app.text_graphs"],
    ["app.served"],
    ["app.slot", "app.failures", "app.stall", "app.worker", "app.intake"],
    ["app.catalog", "app.repository", "app.learning"],
    ["app.runtime"],
    ["app.api", "app.grpc", "app.jobs", "app.snapshot"],
    ["app.main", "app.check", "app.bridge", "app.device_link", "app.frontend"],
    ["app.server", "app.supervisor", "app.listening", "app.frontend.entry", "app.connection",
     "app.bounded",
     "app.refused",
     "app.flow",
     "app.cycle",
     "app.accepting",
     "app.draining", "app.cli", "app.__main__", "app"],
]


def layer(module: str) -> int:
    """The layer of the longest prefix that names ``module`` (app.api.x: app.api's)."""
    matches = [(len(prefix), index) for index, prefixes in enumerate(LAYERS)
               for prefix in prefixes if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} belongs to no layer"
    return max(matches)[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "app" or name.startswith("app.")}


def test_imports_point_down() -> None:
    upward = []
    for path in sorted(APP.rglob("*.py")):
        module = module_name(path)
        if module == "app":
            continue  # the package's face re-exports lazily from every layer
        for imported in imports(path):
            if layer(imported) > layer(module):
                upward.append(f"{module} imports {imported}")
            pair = {module.split(".")[1], imported.split(".")[1]}
            if pair == {"api", "jobs"}:
                upward.append(f"{module} imports {imported}")
    assert not upward, upward


def test_no_import_cycles() -> None:
    """Within a layer too, no module reaches itself through its imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(APP.rglob("*.py")):
        module = module_name(path)
        if module != "app":
            graph[module] = imports(path)

    def known(name: str) -> str | None:  # app.x.Y (a name in a module) -> app.x
        while name and name not in graph:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: {k for i in imps if (k := known(i)) not in (None, m)}
             for m, imps in graph.items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError(" -> ".join([*path[path.index(module):], module]))
        if module in done:
            return
        for other in edges[module]:
            visit(other, [*path, module])
        done.add(module)

    for module in edges:
        visit(module, [])
