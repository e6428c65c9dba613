from __future__ import annotations

import json
import logging
import re

import pytest

from app.api import access
from app.logs import WriterHandler, configure_logging, request_id
from tests.conftest import app_client, isolated_logging, make_settings

pytestmark = pytest.mark.asyncio


async def test_request_id_is_taken_or_generated(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="batchserve.access")
    async with app_client(make_settings()) as client:
        r = await client.get("/health_check", headers={"X-Request-ID": "abc-123"})
        assert r.headers["x-request-id"] == "abc-123"
        generated = (await client.get("/health_check")).headers["x-request-id"]
        assert len(generated) == 32
        bad = await client.get("/health_check", headers={"X-Request-ID": "no spaces\tallowed"})
        assert bad.headers["x-request-id"] != "no spaces\tallowed"
        r = await client.post("/predict", json={"instances": []}, headers={"X-Request-ID": "r-9"})
        assert r.headers["x-request-id"] == "r-9" and r.status_code == 422
    access = [rec for rec in caplog.records if rec.name == "batchserve.access"]
    assert any(rec.status == 422 and rec.path == "/predict" for rec in access)  # type: ignore[attr-defined]


FORGED_PATH = "/models/x\nCRITICAL forged/predict"


def record_line(handler: logging.Handler, level: int, message: str,
                fields: dict[str, object]) -> str:
    """The line logging's own way (a record through the handler) gives."""
    rec = logging.LogRecord("batchserve.access", level, __file__, 1, "%s", (message,), None)
    rec.__dict__.update(fields)
    return handler.format(rec)


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_an_access_line_made_without_a_record_is_the_one_a_record_gives(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fmt: str) -> None:
    """Where the server's handler is the only one, ``log_access`` makes the line itself (no
    record: ``log.log`` is never called) and queues it: the same line, time apart, in either
    format, a request's controls escaped."""
    caplog.set_level(logging.INFO, logger="batchserve.access")
    root, stream = isolated_logging(monkeypatch)
    configure_logging("info", fmt)
    handler = root.handlers[0]
    assert isinstance(handler, WriterHandler)
    monkeypatch.setattr(handler, "_start", lambda: None)  # the line stays queued
    monkeypatch.setattr(access.log, "log", None)  # a record made would fail here
    token = request_id.set("r-1")
    try:
        access.log_access(logging.INFO, "127.0.0.1", "POST", FORGED_PATH, 404, 1.2345)
        access.log_access(logging.WARNING, None, "gRPC", "ModelInfer", "INTERNAL", 2.0)
    finally:
        request_id.reset(token)
    made = [line.rstrip("\n") for line in handler._lines]
    expected = [
        record_line(handler, logging.INFO, f'127.0.0.1 "POST {FORGED_PATH}" 404 1.2ms', {
            "request_id": "r-1", "method": "POST", "path": FORGED_PATH, "status": 404,
            "duration_ms": 1.234, "client": "127.0.0.1"}),
        record_line(handler, logging.WARNING, '- "gRPC ModelInfer" INTERNAL 2.0ms', {
            "request_id": "r-1", "method": "gRPC", "path": "ModelInfer", "status": "INTERNAL",
            "duration_ms": 2.0, "client": None}),
    ]
    if fmt == "json":
        made_entries = [json.loads(line) for line in made]
        expected_entries = [json.loads(line) for line in expected]
        assert all(entry.pop("time").endswith("Z") for entry in made_entries + expected_entries)
        assert made_entries == expected_entries
        assert made_entries[0]["path"] == FORGED_PATH and made_entries[0]["level"] == "info"
    else:
        assert [line[24:] for line in made] == [line[24:] for line in expected]
        assert made[0][24:].startswith("INFO batchserve.access [r-1]: 127.0.0.1")
        assert "\n" not in made[0] and "\\nCRITICAL forged" in made[0]
    assert stream.getvalue() == ""  # queued for the writer, not written by the caller


async def test_an_access_line_goes_through_logging_where_another_handler_listens(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A capture (here pytest's) beside the server's handler gets the record, fields and all."""
    caplog.set_level(logging.INFO, logger="batchserve.access")
    root, _ = isolated_logging(monkeypatch)
    configure_logging("info", "text")
    root.addHandler(caplog.handler)
    access.log_access(logging.INFO, "::1", "GET", "/health_check", 200, 0.5)
    (rec,) = [r for r in caplog.records if r.name == "batchserve.access"]
    assert rec.getMessage() == '::1 "GET /health_check" 200 0.5ms'
    assert (rec.method, rec.path, rec.status, rec.client) == (  # type: ignore[attr-defined]
        "GET", "/health_check", 200, "::1")


async def test_a_filter_added_to_the_servers_handler_still_sees_each_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="batchserve.access")
    root, _ = isolated_logging(monkeypatch)
    configure_logging("info", "text")
    handler = root.handlers[0]
    assert isinstance(handler, WriterHandler)
    monkeypatch.setattr(handler, "_start", lambda: None)
    handler.addFilter(lambda rec: "/health_check" not in rec.getMessage())
    access.log_access(logging.INFO, "::1", "GET", "/health_check", 200, 0.5)
    access.log_access(logging.INFO, "::1", "GET", "/metrics", 200, 0.5)
    assert [line.split(": ", 1)[1] for line in handler._lines] == [
        '::1 "GET /metrics" 200 0.5ms\n']


# The text line's fields, as a log reader takes them: client (bare, or quoted with escapes),
# then "METHOD path" with escapes, status, duration.
LINE = re.compile(r'(?P<client>[^ "]+|"(?:[^"\\]|\\.)*") "(?P<method>\S+) '
                  r'(?P<path>(?:[^"\\]|\\.)*)" (?P<status>\S+) (?P<ms>[\d.]+)ms')


@pytest.mark.parametrize(("client", "path"), [
    ('1.2.3.4" "GET /admin" 200 0.1ms [x', "/predict"),  # X-Forwarded-For, trusted proxy's
    ("10.0.0.1 evil", "/predict"),
    ("::1", '/x" 200 0.1ms "'),  # a decoded %22
    ("::1", "/a\\nCRITICAL forged"),  # a path's own backslash, not an escaped line break
    ("::1", "/a b/c"),
])
async def test_no_path_or_client_ends_its_field_in_the_text_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, client: str,
        path: str) -> None:
    caplog.set_level(logging.INFO, logger="batchserve.access")
    root, _ = isolated_logging(monkeypatch)
    configure_logging("info", "text")
    root.addHandler(caplog.handler)
    access.log_access(logging.INFO, client, "POST", path, 404, 0.5)
    (rec,) = [r for r in caplog.records if r.name == "batchserve.access"]
    fields = LINE.fullmatch(rec.getMessage())
    assert fields is not None, rec.getMessage()
    client_field = fields["client"]
    unescaped = {name: re.sub(r"\\(.)", r"\1", value) for name, value in {
        **fields.groupdict(), "client": client_field[1:-1] if client_field[0] == '"'
        else client_field}.items()}
    assert unescaped["client"] == client
    assert (unescaped["method"], unescaped["path"], unescaped["status"]) == ("POST", path, "404")


@pytest.mark.parametrize("given", ["abc\n", "abc\r\n", "", "a" * 129, "a b"])
async def test_an_id_a_client_gives_is_its_own_only_whole_and_sane(given: str) -> None:
    """A gRPC stream's request ``id`` (any protobuf string) reached the log's ``[id]`` prefix
    with its line break: one record, two lines."""
    ids = access.RequestIds()
    assert ids.take("abc-1.2:3") == "abc-1.2:3"
    taken = ids.take(given)
    assert taken != given and taken.isalnum()
