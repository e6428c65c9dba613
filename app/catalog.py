"""Where models come from: a folder in Triton's layout, or the single ``--model`` setting.

A catalog lists model sources: a name, its settings, and its versions (version -> the model
setting that builds it). Reading it never loads a model. Layout (docs/models.md):

    DIR/NAME/config.toml     that model's settings (model = "...", max_batch_size = 8, ...)
    DIR/NAME/1/model.pt      a numbered version: TorchScript (model.pt) or torch.export (model.pt2)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.config import BatchSettings, ModelSettings, Settings
from app.errors import ConfigError
from app.models.base import ModelHandler
from app.values import describe_errors, unknown_settings

MODEL_FILES = ("model.pt", "model.pt2")
CONFIG_FILE = "config.toml"


@dataclass(frozen=True)
class ModelSource:
    """One model the catalog knows: ``reason`` says why it cannot be served, if it cannot."""

    name: str
    settings: ModelSettings | None
    versions: dict[str, str] = field(default_factory=dict)  # "1" -> "path/1/model.pt"
    reason: str = ""
    handler: ModelHandler | None = None  # built already (the single-model setting)
    missing: bool = False  # no such model in the repository

    def wanted(self) -> list[str]:
        """The versions to serve: those the settings name, or the newest."""
        numbers = sorted(self.versions, key=int)
        if self.settings is not None and self.settings.versions is not None:
            return [str(v) for v in self.settings.versions]
        return numbers[-1:]


def model_settings(server: Settings, values: dict[str, Any]) -> ModelSettings:
    """A model's settings: its own ``values`` over what the user set for the whole server (a
    model's ``model`` is never inherited). Raises ValueError naming what is wrong."""
    unknown = unknown_settings(values, ModelSettings.model_fields)  # a load's config's too
    if unknown:
        raise ValueError(unknown)
    inherited = {k: getattr(server, k) for k in server.explicit
                 if k in BatchSettings.model_fields and k != "model"}
    try:
        return ModelSettings(**{**inherited, **values})
    except ValidationError as exc:
        raise ValueError(describe_errors(exc)) from None


class Catalog:
    """The sources a server serves from. ``sources()`` reads them afresh each call."""

    def __init__(self, settings: Settings, handler: ModelHandler | None = None) -> None:
        self.settings = settings
        self.root = Path(settings.model_repository) if settings.model_repository else None
        self._handler = handler
        if self.root is not None and not self.root.is_dir():
            raise ConfigError(f"model_repository: {self.root} is not a folder")

    @property
    def single(self) -> bool:
        """Serving the one ``--model`` setting, not a repository folder."""
        return self.root is None

    def startup(self, names: list[str] | None, default: str | None = None) -> list[str] | None:
        """The models to load at start: ``names`` (explicit mode's ``load_model``), or None for
        every one (the single ``--model`` always loads). A name in ``names`` or ``default``
        (``default_model``) that is not a model here is a ConfigError, as Triton refuses to
        start without a model it was told to load."""
        defaults = [default] if default is not None else []
        for setting, given in (("load_model", names or []), ("default_model", defaults)):
            unknown = self._unknown(given)
            if unknown:
                raise ConfigError(f"{setting} names {', '.join(unknown)}: {self._holds()}")
        return None if self.single else names

    def _unknown(self, names: list[str]) -> list[str]:
        if self.root is None:
            assert self._handler is not None
            return sorted(set(names) - {self._handler.name})
        return [n for n in names if _folder(self.root, n) is None]

    def _holds(self) -> str:
        """What this catalog serves, in words."""
        if self.root is None:
            assert self._handler is not None
            return (f"this server serves one model, '{self._handler.name}' (the model setting); "
                    "model_repository serves several")
        have = ", ".join(sorted(self.sources())) or "nothing"
        return f"not in the model repository {self.root} (it has {have})"

    def sources(self) -> dict[str, ModelSource]:
        if self.root is None:
            assert self._handler is not None
            return {self._handler.name: self._single(self._handler.name, None)}
        return {p.name: self.read(p.name) for p in sorted(self.root.iterdir())
                if p.is_dir() and not p.name.startswith(".")}

    def read(self, name: str, override: dict[str, Any] | None = None) -> ModelSource:
        """One model's source; ``override`` (a load request's config) wins over its file."""
        if self.root is None:
            return self._single(name, override)
        folder = _folder(self.root, name)
        if folder is None:
            return ModelSource(name, None, reason="no such model in the repository", missing=True)
        try:
            values = _config_values(folder)
            versions = _versions(folder)
            values.update(override or {})
            settings = model_settings(self.settings, values)
        except ValueError as exc:
            return ModelSource(name, None, reason=str(exc))
        if versions and "model" in values:
            return ModelSource(name, settings, reason=(
                f"both a model setting ({values['model']}) and version folders "
                f"({', '.join(sorted(versions, key=int))}): give one"))
        if not versions:
            if "model" not in values:
                return ModelSource(name, settings, reason=_no_model(folder))
            versions = {"1": settings.model}
        source = ModelSource(name, settings, versions)
        missing = [v for v in source.wanted() if v not in versions]
        if missing:
            return ModelSource(name, settings, versions,
                               reason=f"versions {', '.join(missing)} are not in the repository")
        return source

    def _single(self, name: str, override: dict[str, Any] | None) -> ModelSource:
        """The ``--model`` setting as a repository of one model. A load's ``config`` goes over
        what the user set for the server, as a repository model's file does."""
        assert self._handler is not None
        if name != self._handler.name:
            return ModelSource(name, None, missing=True,
                               reason=f"no such model; this server serves '{self._handler.name}'")
        if override is None:
            values = {k: getattr(self.settings, k) for k in BatchSettings.model_fields}
            return ModelSource(name, ModelSettings(**values), {"1": self.settings.model},
                               handler=self._handler)
        try:
            settings = model_settings(self.settings, {"model": self.settings.model, **override})
        except ValueError as exc:
            return ModelSource(name, None, reason=str(exc))
        same = settings.model == self.settings.model
        return ModelSource(name, settings, {"1": settings.model},
                           handler=self._handler if same else None)


def _folder(root: Path, name: str) -> Path | None:
    """Model ``name``'s folder in ``root``, or None: no such folder, or a name that is not one
    folder's (empty, hidden, a path, too long, a NUL: what a client may send as a name)."""
    if not name or name.startswith(".") or "/" in name:
        return None
    folder = root / name
    try:
        return folder if folder.is_dir() else None
    except (OSError, ValueError):
        return None


def _config_values(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        values = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} cannot be read: {exc}") from None
    unknown = unknown_settings(values, ModelSettings.model_fields)
    if unknown:
        raise ValueError(f"{path}: {unknown}")
    return values


def _versions(folder: Path) -> dict[str, str]:
    versions: dict[str, str] = {}
    for path in _numbered(folder):
        files = [path / f for f in MODEL_FILES if (path / f).is_file()]
        if len(files) > 1:
            raise ValueError(f"{path} holds both {MODEL_FILES[0]} and {MODEL_FILES[1]}")
        version = str(int(path.name))
        if files and version in versions:  # "01" and "1": which to serve is not for a guess
            other = Path(versions[version]).parent.name
            raise ValueError(f"{folder}: folders {other} and {path.name} are both version "
                             f"{version}")
        if files:
            versions[version] = str(files[0])
    return versions


def _numbered(folder: Path) -> list[Path]:
    """The folders in ``folder`` named by a number: its version folders, filled or not."""
    return [path for path in sorted(folder.iterdir())
            if path.is_dir() and path.name.isascii() and path.name.isdigit()]


def _no_model(folder: Path) -> str:
    """Why a model's folder names no model: what is missing, and any version folder with no
    model file in it (a file misnamed, or not copied yet)."""
    config = (f"{CONFIG_FILE} sets none" if (folder / CONFIG_FILE).is_file()
              else f"there is no {CONFIG_FILE}")
    empty = [path.name for path in _numbered(folder)]
    if empty:
        return (f"no model: {config}, and version folder {', '.join(empty)} holds no "
                f"{MODEL_FILES[0]} or {MODEL_FILES[1]}")
    return (f"no model: {config}, and there is no version folder (1/{MODEL_FILES[0]} or "
            f"1/{MODEL_FILES[1]})")
