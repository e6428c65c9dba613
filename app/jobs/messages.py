"""What a job and its result look like in Redis; shared by workers and clients (no torch here).

A job is a stream entry with one field ``job``: JSON ``{"id", "instances"}``, and optionally
``"priority"`` (a level of the model's, 1 the most urgent) and the W3C trace context of its
sender (``"traceparent"``, ``"tracestate"``). Its result is stored
at ``batchserve:result:<id>`` and announced on ``batchserve:results``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from app.errors import InvalidInput, ServeError, bounded
from app.payload import instances_of, whole_number_of
from app.tracing import CONTEXT_HEADERS

RESULT_KEY = "batchserve:result:"
RESULTS_STREAM = "batchserve:results"
RESULTS_MAXLEN = 100_000  # announcements kept (approximately); results live under their keys


def dead_stream(job_stream: str) -> str:
    return job_stream + ":dead"


@dataclass(frozen=True)
class Job:
    """A parsed stream entry: ``id`` None means the entry has no usable id (``error`` says
    what is wrong with it, for its dead letter)."""

    entry: str
    id: str | None
    instances: list[Any] | None
    error: ServeError | None
    raw: bytes
    priority: int | None = None  # the job's priority level (None: the model's default)
    trace: dict[str, str] = field(default_factory=dict)  # the sender's trace context


def parse_job(entry: str, fields: dict[bytes, bytes], max_instances: int) -> Job:
    """Never raises: a malformed job comes back with ``id`` None or an ``error``."""
    raw = fields.get(b"job")
    if raw is None:
        return _unusable(entry, b"", "the entry has no 'job' field")
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _unusable(entry, raw, f"'job' is not JSON: {exc}")
    job_id = payload.get("id") if isinstance(payload, dict) else None
    if not isinstance(job_id, str) or not job_id:
        return _unusable(entry, raw, "'job' has no 'id': a job is a JSON object whose 'id' is "
                         "a string, not empty")
    trace = {k: v for k in CONTEXT_HEADERS if isinstance(v := payload.get(k), str)}
    try:
        priority = whole_number_of(payload.get("priority"), "'priority'")
        return Job(entry, job_id, instances_of(payload, max_instances), None, raw, priority,
                   trace)
    except ServeError as exc:
        return Job(entry, job_id, None, exc, raw)


def _unusable(entry: str, raw: bytes, why: str) -> Job:
    return Job(entry, None, None, InvalidInput(why), raw)


def error_result(job_id: str, type_: str, message: str) -> dict[str, Any]:
    """A job's error result; its message cut as any message a client is sent (a model's
    exception, an instance it quotes: kept ``result_ttl_s`` in Redis, printed by ``submit``)."""
    return {"id": job_id, "status": "error",
            "error": {"type": type_, "message": bounded(message)}}
