"""Where settings come from, lowest to highest priority: built-in defaults (app/config.py), a
TOML file, the environment (``BATCHSERVE_*``), command-line flags."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.config import CONFIG_ENV, ENV_PREFIX, Settings
from app.errors import ConfigError
from app.values import describe_errors, nearest, unknown_settings


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML settings file: top-level keys are setting names (``max_batch_size = 32``)."""
    try:
        with Path(path).open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8 text
        raise ConfigError(f"config file {path} is not valid TOML: the byte at offset {exc.start} "
                          "is not UTF-8") from exc
    unknown = unknown_settings(data, Settings.model_fields)
    if unknown:
        raise ConfigError(f"config file {path}: {unknown}")
    return data


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build Settings from defaults, a TOML file, the environment and explicit overrides.

    ``config_file`` defaults to ``$BATCHSERVE_CONFIG``. ``overrides`` (command-line flags) win over
    everything; ``None`` values in it mean "not given". Raises ConfigError with a readable message.
    """
    path = config_file if config_file is not None else os.environ.get(CONFIG_ENV)
    file_values = read_config_file(path) if path else {}
    given = {k: v for k, v in (overrides or {}).items() if v is not None}

    layered_settings = type("LayeredSettings", (Settings,), {"file_values": file_values})
    try:
        layered = layered_settings(**given)
    except ValueError as exc:
        raise ConfigError(describe_errors(exc, lambda name: setter(name, given, path, file_values,
                                                                   os.environ))) from exc
    return Settings(**{name: getattr(layered, name) for name in layered.explicit})


def setter(name: str, flags: Mapping[str, Any], path: str | os.PathLike[str] | None,
           file_values: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """What set setting ``name``: its flag, else its variable, else the config file (the order
    in which they win); None for its default."""
    if name in flags:
        return f"--{name.replace('_', '-')}"
    variable = ENV_PREFIX + name.upper()
    if any(key.upper() == variable for key in environ):
        return variable
    return str(path) if name in file_values else None


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One warning for each ``BATCHSERVE_*`` variable that names no setting (a typo is
    otherwise ignored in silence), with the setting it most resembles."""
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields} | {CONFIG_ENV}
    warnings = []
    for key in sorted(k for k in environ if k.upper().startswith(ENV_PREFIX)):
        if key.upper() in known:
            continue
        near = nearest(key.upper().removeprefix(ENV_PREFIX),
                       [k.removeprefix(ENV_PREFIX) for k in known])
        hint = f"; did you mean {ENV_PREFIX}{near}?" if near else ""
        warnings.append(f"{key} is not a batchserve setting and is ignored{hint}")
    return warnings
