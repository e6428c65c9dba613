"""What a front end knows of the model repository (docs/frontends.md): the device process
sends it on connect and after every load or unload (app/bridge.py); a front end decodes with
the handlers it holds, or builds one from the model setting (app/frontend/remote.py), and never
loads weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.config import BatchSettings
from app.errors import ServeError
from app.models.signature import TensorSpec

if TYPE_CHECKING:  # the device process's side; front ends import no torch
    from app.runtime import InferenceService
    from app.served import ServedModel


@dataclass(frozen=True)
class ModelEntry:
    """One model version as a front end needs it: ``handler``, the handler to decode with,
    pickled (``ModelHandler.for_frontends``), or None where ``spec`` builds one there."""

    name: str
    version: str
    spec: str
    settings: BatchSettings
    state: str
    outputs: list[TensorSpec] | None
    handler: bytes | None


@dataclass(frozen=True)
class Snapshot:
    """The repository as ``ModelRepository.get`` resolves names: served versions (or those
    still loading, where none is served), the default traffic's version, failed names."""

    served: dict[str, dict[str, ModelEntry]] = field(default_factory=dict)
    current: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    default: str | None = None  # the name /predict serves; None: see default_error
    default_error: str = ""
    loading: list[str] = field(default_factory=list)  # names loading with no version to show


def snapshot(service: InferenceService) -> Snapshot:
    repo = service.repository

    def entry(model: ServedModel) -> ModelEntry:
        return ModelEntry(model.name, model.version, model.spec, model.settings,
                          model.state.value, model.outputs, model.sent_handler)

    served = {name: {v: entry(m) for v, m in versions.items()}
              for name, versions in repo.served.items() if versions}
    for name, models in repo.loading.items():
        if models and name not in served:
            served[name] = {m.version: entry(m) for m in models}
    try:
        default, error = repo.default_name(), ""
    except ServeError as exc:
        default, error = None, exc.message
    loading = [name for name, models in repo.loading.items() if not models]
    return Snapshot(served, dict(repo.current), dict(repo.failed), repo.names(), default, error,
                    loading)
