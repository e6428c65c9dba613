"""Parsing stream entries into jobs (app/jobs/messages.py): never raises, says what is wrong."""

from __future__ import annotations

import orjson
import pytest

from app.errors import MAX_MESSAGE_BYTES
from app.jobs.messages import error_result, parse_job


@pytest.mark.parametrize(
    ("fields", "job_id", "error"),
    [
        ({b"job": b'{"id": "a", "instances": [1, 2]}'}, "a", None),
        ({b"job": b'{"id": "a", "instances": []}'}, "a", "is empty"),
        ({b"job": b'{"id": "a", "instances": [1, 2, 3]}'}, "a", "limit of 2"),
        ({b"job": b'{"id": "a"}'}, "a", 'missing field "instances"'),
        ({b"job": b'{"id": "", "instances": [1]}'}, None, "has no 'id'"),
        ({b"job": b'{"id": 7, "instances": [1]}'}, None, "has no 'id'"),
        ({b"job": b'["id", "a"]'}, None, "a JSON object whose 'id' is a string"),
        ({b"job": b"\xff"}, None, "'job' is not JSON: str is not valid UTF-8"),
        ({b"job": b'{"id": "a", "instances": [NaN]}'}, None, "'job' is not JSON: unexpected"),
        ({b"other": b"x"}, None, "no 'job' field"),
    ],
)
def test_parse_job(fields: dict[bytes, bytes], job_id: str | None, error: str | None) -> None:
    job = parse_job("1-0", fields, max_instances=2)
    assert job.entry == "1-0" and job.id == job_id
    if error is None:
        assert job.error is None
    else:
        assert job.error is not None and error in job.error.message
    if job_id is not None and error is None:
        assert job.instances == orjson.loads(fields[b"job"])["instances"]


def test_a_jobs_priority_is_read_and_checked() -> None:
    job = parse_job("1-0", {b"job": b'{"id": "a", "instances": [1], "priority": 1}'}, 8)
    assert job.priority == 1 and job.error is None
    bad = parse_job("1-0", {b"job": b'{"id": "a", "instances": [1], "priority": "x"}'}, 8)
    assert bad.error is not None and "'priority' must be a whole number" in bad.error.message


def test_an_error_results_message_is_cut_as_a_clients() -> None:
    message = "the model failed: " + "x" * 100_000 + " (the end)"
    error = error_result("a", "model_error", message)["error"]
    assert len(error["message"].encode()) <= MAX_MESSAGE_BYTES
    assert error["message"].startswith("the model failed: ")
    assert error["message"].endswith(" (the end)")
    assert error_result("a", "invalid_input", "short")["error"]["message"] == "short"
