"""The handler a front end decodes a model's requests with (app/frontend/remote.py): the device
process's own, sent without its module or weights (``ModelHandler.for_frontends``), where this
front end can read it; else one built here from the model setting."""

from __future__ import annotations

import logging
import pickle
from typing import cast

from app.errors import BatchServeError
from app.models.base import ModelHandler
from app.models.registry import load_handler
from app.process import one_torch_thread
from app.snapshot import ModelEntry

log = logging.getLogger("batchserve.frontend")


def handler_for(entry: ModelEntry) -> ModelHandler | None:
    """The handler to decode with: the device's own without weights (``for_frontends``) where
    it sent one this front end can read, else one built here from the model setting (importing
    a model's module may take long: this runs off the event loop)."""
    try:
        return _received(entry) or _built(entry)
    finally:
        one_torch_thread()


def _received(entry: ModelEntry) -> ModelHandler | None:
    if entry.handler is None:
        return None
    try:
        return cast(ModelHandler, pickle.loads(entry.handler))
    except Exception as exc:  # noqa: BLE001 - whatever unpickling its class raises
        log.warning("model %s: the handler sent could not be read here (%s: %s); "
                    "building one from its model setting", entry.name, type(exc).__name__, str(exc))
        return None


def _built(entry: ModelEntry) -> ModelHandler | None:
    try:
        return load_handler(entry.spec, entry.name)
    except BatchServeError as exc:
        log.error("model %s: %s", entry.name, exc.message)
    except Exception as exc:  # noqa: BLE001 - a user's handler raises what it raises
        log.error("model %s: its handler could not be built here: %s: %s", entry.name,
                  type(exc).__name__, str(exc))
    return None
