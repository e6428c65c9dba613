"""batchserve: an HTTP inference server for PyTorch models with dynamic batching.

The public API is importable from here. Names are loaded on first use, so that importing one light
piece (``app.jobs.client.submit``, ``app.config.Settings``) does not pull in torch or FastAPI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from app.version import __version__

_EXPORTS = {
    "ModelHandler": "app.models.base",
    "decode_abandoned": "app.models.base",
    "Settings": "app.config",
    "load_settings": "app.sources",
    "create_app": "app.main",
    "submit": "app.jobs.client",
    "submit_async": "app.jobs.client",
    "BatchServeError": "app.errors",
    "ConfigError": "app.errors",
    "ModelLoadError": "app.errors",
    "ServeError": "app.errors",
    "InvalidInput": "app.errors",
    "PayloadTooLarge": "app.errors",
    "Unauthorized": "app.errors",
    "NotFound": "app.errors",
    "Unavailable": "app.errors",
    "DeadlineExceeded": "app.errors",
    "ModelError": "app.errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from app.config import Settings as Settings
    from app.errors import (
        BatchServeError as BatchServeError,
    )
    from app.errors import (
        ConfigError as ConfigError,
    )
    from app.errors import (
        DeadlineExceeded as DeadlineExceeded,
    )
    from app.errors import (
        InvalidInput as InvalidInput,
    )
    from app.errors import (
        ModelError as ModelError,
    )
    from app.errors import (
        ModelLoadError as ModelLoadError,
    )
    from app.errors import (
        NotFound as NotFound,
    )
    from app.errors import (
        PayloadTooLarge as PayloadTooLarge,
    )
    from app.errors import (
        ServeError as ServeError,
    )
    from app.errors import (
        Unauthorized as Unauthorized,
    )
    from app.errors import (
        Unavailable as Unavailable,
    )
    from app.jobs.client import submit as submit
    from app.jobs.client import submit_async as submit_async
    from app.main import create_app as create_app
    from app.models.base import ModelHandler as ModelHandler
    from app.models.base import decode_abandoned as decode_abandoned
    from app.sources import load_settings as load_settings


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'app' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
