"""A model call that failed on a device thread (app/worker.py): which of its items are tried
again, in which parts, and what the rest are answered.

Out of memory: each half on its own, with the model's batch limit lowered below the batch,
down to a single item, which fails alone. A model that raises on several requests' items: each
half on its own, down to one request's items, so that an input the model cannot take fails the
request that sent it, not the requests batched with it. A failed batch logs its traceback (a
line where it is the same error as the model's last, within a minute: a model broken on every
batch, or a client sending what it cannot take, does not flood the log) and one line saying how
many of its requests failed alone.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass

import torch

from app.errors import ModelError, first_line
from app.pending import PendingItem, halves, one_request
from app.slot import Slot

log = logging.getLogger("batchserve.worker")

# A model failing again as it last did logs a line; its traceback again after this long.
TRACEBACK_EVERY_S = 60.0

Parts = tuple[list[PendingItem], list[PendingItem]]


@dataclass(frozen=True, slots=True)
class Retry:
    """What follows a failed model call (``after_failure``)."""

    parts: Parts | None  # each tried on its own; None: every item is answered ``error``
    error: ModelError
    apart: bool  # the parts are a failed batch's, tried apart (their failures log no traceback)


def after_failure(exc: Exception, label: str, slot: Slot, items: list[PendingItem], rows: int,
                  apart: bool) -> Retry:
    """What follows ``exc``, raised by the model on ``items`` (``rows`` instances) on device
    ``label``; ``apart``: they are a part of a failed batch. Call it where ``exc`` is caught:
    the batch's log line carries its traceback."""
    parts = halves(items, rows)
    if isinstance(exc, torch.OutOfMemoryError):
        return Retry(parts, out_of_memory(label, slot, rows, alone=parts is None), apart)
    alone = one_request(items, rows)
    log_failure(label, slot, rows, alone, apart)
    return Retry(None if alone else parts, ModelError(), True)


def out_of_memory(label: str, slot: Slot, rows: int, alone: bool) -> ModelError:
    """Out of memory on ``rows``: the model's batch limit lowered below them; the error of a
    single item (``alone``)."""
    if alone:
        log.error("device %s: out of memory on a single item of %s", label, slot.model.name)
        return ModelError("the model ran out of device memory on this item alone")
    if rows // 2 < slot.batch_limit:
        slot.batch_limit = rows // 2
        log.warning("device %s: out of memory at batch %d of %s; batch limit lowered to %d",
                    label, rows, slot.model.name, rows // 2)
    return ModelError()


def log_failure(label: str, slot: Slot, rows: int, alone: bool = True,
                apart: bool = False) -> None:
    """The model raised on ``rows`` instances (call it where the error is caught): a batch's
    failure (its requests then tried apart unless ``alone``) with its traceback, or in a line
    where the model's last traceback, under ``TRACEBACK_EVERY_S`` ago, was the same error's;
    nothing for a part of a failed batch (``apart``), which ``log_apart`` counts."""
    if apart:
        return
    error = sys.exc_info()[1]
    said = f"{type(error).__name__}: {first_line(error)}" if error else "unknown"
    now = time.monotonic()
    tried = "" if alone else "; its requests are tried apart"
    if slot.traced is not None and slot.traced[0] == said and now - slot.traced[1] < \
            TRACEBACK_EVERY_S:
        log.error("device %s: %s failed on a batch of %d%s (%s, as logged before)", label,
                  slot.model.name, rows, tried, said)
        return
    slot.traced = (said, now)
    log.exception("device %s: %s failed on a batch of %d%s", label, slot.model.name, rows, tried)


def log_apart(label: str, model: str, rows: int, failed: int) -> None:
    """How a failed batch of ``rows`` instances, tried apart, ended: one line a batch, however
    many of its requests failed alone (``failed``)."""
    log.error("device %s: %s's batch of %d tried apart: %d of its requests failed alone",
              label, model, rows, failed)
