"""The device process's admission of a front end's requests (app/bridge.py): a message's
requests for one model version and level pass ``ServedModel.gate`` together, in order, each
counted ahead of the next, and those admitted enter the queue as one entry. Never waits; a
refusal is returned at once. No deadline timer is set: the front ends keep the deadlines, and
device threads skip the items past theirs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from app.errors import ServeError
from app.pending import Answer, PendingRequest, rows_request
from app.served import ServedModel


def admit_all(model: ServedModel, level: int, requests: list[tuple[Any, float, Answer]]
              ) -> list[PendingRequest | ServeError]:
    """Admit or refuse each of ``requests`` (items: a list, or their rows stacked in one
    array; a deadline; its answer) whole, as ``check_admissible`` and ``enqueue`` would one
    after another: one-item requests all at once where the gate says each would pass
    (``Gate.admit_all``), else one by one."""
    try:
        gate = model.gate(level)
    except ServeError as exc:
        return [exc] * len(requests)
    now = time.monotonic()
    if requests and all(len(items) == 1 for items, _, _ in requests) and gate.admit_all(
            len(requests), min(deadline for _, deadline, _ in requests), now):
        admitted = [(PendingRequest(answer, 1, deadline, now, level), items)
                    for items, deadline, answer in requests]  # one-item requests, all passed
        model.put_admitted(admitted, now)
        return [request for request, _ in admitted]
    outcomes: list[PendingRequest | ServeError] = []
    admitted = []
    for items, deadline, answer in requests:
        refused = gate.refusal(len(items), deadline, now)
        if refused is None:
            request = PendingRequest(answer, len(items), deadline, now, level)
            admitted.append((request, items))
        outcomes.append(refused or request)
    if admitted:
        model.put_admitted(admitted, now)
    return outcomes


def admit_rows(model: ServedModel, level: int, rows: Any, deadlines: Sequence[float],
               answer_for: Callable[[list[int] | None], Answer]
               ) -> tuple[PendingRequest | None, list[tuple[int, ServeError]]]:
    """One-row requests (``rows``: their items, a list or stacked in one array; each with its
    deadline), admitted as ``admit_all`` admits them; those admitted queue as one chunk, one
    request that stands for them (app/pending.py: one item, or an item a row if they came as
    a list or the model's rows do not stack), answered by ``answer_for(their places)`` (None:
    all of them). Returns that request (None: all refused) and each refusal's place."""
    try:
        gate = model.gate(level)
    except ServeError as exc:
        return None, [(i, exc) for i in range(len(deadlines))]
    now = time.monotonic()
    kept: list[int] | None = None
    refused: list[tuple[int, ServeError]] = []
    if not gate.admit_all(len(deadlines), min(deadlines), now):  # one by one, as admit_all
        refusals = [gate.refusal(1, deadline, now) for deadline in deadlines]
        kept = [i for i, refusal in enumerate(refusals) if refusal is None]
        refused = [(i, refusal) for i, refusal in enumerate(refusals) if refusal is not None]
        if not kept:
            return None, refused
        rows = rows[kept] if type(rows) is np.ndarray else [rows[i] for i in kept]
        deadlines = [deadlines[i] for i in kept]
    request = rows_request(answer_for(kept), deadlines, now, level)
    model.put_admitted([(request, rows)], now)
    return request, refused
