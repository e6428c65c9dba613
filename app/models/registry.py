"""Resolve the ``model`` setting to a handler: builtin name, module:callable, .pt or .pt2 file."""

from __future__ import annotations

import asyncio
import importlib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from app.errors import ModelLoadError, first_line
from app.models.base import ModelHandler
from app.models.builtin import linear_handler, mlp_handler
from app.models.tensor import TensorHandler
from app.process import freezing
from app.tasks import on_own_thread

if TYPE_CHECKING:
    import torch


def _minilm() -> ModelHandler:
    from app.models.minilm import MiniLMHandler

    return MiniLMHandler()


BUILTINS: dict[str, Callable[[], ModelHandler]] = {
    "minilm": _minilm,
    "linear": linear_handler,
    "mlp": mlp_handler,
}


async def build_handler(spec: str, name: str) -> ModelHandler:
    """``load_handler`` on a thread of its own, as importing a model's code and calling its
    factory (reading weights, loading a program) may take long: the event loop serves on
    meanwhile. A daemon thread: one that never returns keeps no exit waiting."""
    with freezing(asyncio.get_running_loop()):
        return await on_own_thread(f"build-{name}", load_handler, spec, name)


def load_handler(spec: str, name: str | None = None) -> ModelHandler:
    """Build the handler for ``spec``; weights for a device are loaded later by ``load``.

    Raises ModelLoadError, with one line saying why, for anything that cannot be served."""
    if spec in BUILTINS:
        handler = BUILTINS[spec]()
    elif spec.endswith(".pt2"):
        handler = _exported(Path(spec))
    elif spec.endswith((".pt", ".pth")):
        handler = _torchscript(Path(spec))
    elif ":" in spec:
        handler = _from_callable(spec)
    else:
        raise ModelLoadError(
            f"unknown model {spec!r}: expected one of {', '.join(sorted(BUILTINS))}, "
            "module:callable, or a .pt / .pt2 file"
        )
    if name:
        handler.name = name
    return handler


def _from_callable(spec: str) -> ModelHandler:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError, or the module's own
        raise ModelLoadError(f"cannot import {spec!r}: {type(exc).__name__}: {exc}") from exc
    try:
        obj = factory()
    except Exception as exc:  # noqa: BLE001 - whatever the user's factory raises
        raise ModelLoadError(f"{spec!r} raised {type(exc).__name__}: {exc}") from exc
    if isinstance(obj, ModelHandler):
        return obj
    import torch  # a module: the device process only (front ends get for_frontends' copy)

    if isinstance(obj, torch.nn.Module):
        return TensorHandler.from_module(attr, obj)
    raise ModelLoadError(f"{spec!r} returned {type(obj).__name__}, not an nn.Module or handler")


# The kinds of model file, as messages name them and ``_held`` tells them apart.
TORCHSCRIPT, EXPORTED = "TorchScript file", "torch.export program"


def _require(path: Path, kind: str) -> None:
    """The file exists and is a zip archive, as TorchScript and torch.export files are."""
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist")
    if not zipfile.is_zipfile(path):
        raise ModelLoadError(f"{path} is not a {kind} (not a zip archive)")


def _not_a_model(path: Path, kind: str, exc: Exception) -> ModelLoadError:
    """Why ``path`` did not load: what it holds instead, where the archive tells another kind
    (torch's own words there, "an internal miniz error", "check the warnings above", name no
    cause); else torch's."""
    held = _held(path)
    if held is None:
        return ModelLoadError(f"{path} is not a {kind}: {first_line(exc)}")
    if held[0] == kind:  # the right kind, broken or needing what is not here (a custom op)
        return ModelLoadError(f"{path}: the {kind} did not load: {first_line(exc)}")
    return ModelLoadError(f"{path} is not a {kind}: {held[1]}")


def _held(path: Path) -> tuple[str, str] | None:
    """The kind of model a zip archive torch wrote holds, by its members' names, and what to
    do with it."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [name.partition("/")[2] for name in archive.namelist()]
    except (OSError, zipfile.BadZipFile):
        return None
    if "constants.pkl" in names and any(name.startswith("code/") for name in names):
        return TORCHSCRIPT, "it holds a TorchScript module: name it .pt"
    if "models/model.json" in names:
        return EXPORTED, "it holds a torch.export program: name it .pt2"
    if "data.pkl" in names:
        return "checkpoint", (
            "it holds a torch.save checkpoint (weights or a pickled module), which names no "
            "code to run: save the model with torch.jit.save(torch.jit.script(model), 'm.pt') "
            "or torch.export.save(torch.export.export(model, (example,)), 'm.pt2'), or serve "
            "its code as module:callable")
    return None


def _torchscript(path: Path) -> ModelHandler:
    _require(path, TORCHSCRIPT)
    import torch

    try:
        probe: Any = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, ValueError, ...
        raise _not_a_model(path, TORCHSCRIPT, exc) from exc
    shape = getattr(probe, "input_shape", None)

    def build(device: torch.device) -> torch.nn.Module:
        module: Any = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
        return cast(torch.nn.Module, module.eval())

    return TensorHandler(path.stem, build, tuple(shape) if shape is not None else None)


def _exported(path: Path) -> ModelHandler:
    """A ``torch.export`` program: its one input's shape gives the per-item shape."""
    _require(path, EXPORTED)
    import torch

    try:
        program = torch.export.load(str(path))
    except Exception as exc:  # noqa: BLE001
        raise _not_a_model(path, EXPORTED, exc) from exc
    user_inputs = set(program.graph_signature.user_inputs)
    shapes = [
        node.meta["val"].shape
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in user_inputs
    ]
    if len(shapes) != 1:
        raise ModelLoadError(f"{path}: expected a program with one tensor input, got {len(shapes)}")
    batch_dim, *item_dims = shapes[0]
    item_shape = tuple(int(d) if isinstance(d, int) else -1 for d in item_dims)
    max_batch = None
    if isinstance(batch_dim, int):
        if batch_dim != 1:
            raise ModelLoadError(
                f"{path}: exported with a fixed batch of {batch_dim}; export with a dynamic batch "
                "dimension (dynamic_shapes={'x': {0: torch.export.Dim('batch')}})"
            )
        max_batch = 1

    def build(device: torch.device) -> torch.nn.Module:
        return torch.export.load(str(path)).module().to(device)

    return TensorHandler(
        path.stem, build, None if -1 in item_shape else item_shape, max_batch_size=max_batch
    )
