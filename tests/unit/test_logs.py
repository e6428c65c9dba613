"""Log lines: one record per line whatever a request puts in it, in text and JSON."""

from __future__ import annotations

import json
import logging

from app.logs import JsonFormatter, TextFormatter

FORGED = "x\nCRITICAL batchserve [None]: forged\x00\r\t\x1b[31m"


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("batchserve.access", logging.INFO, __file__, 1, message, args, None)


def test_text_lines_escape_control_characters_from_requests() -> None:
    line = TextFormatter("%(levelname)s %(name)s: %(message)s").format(
        record('%s "%s %s" %d', "127.0.0.1", "POST", f"/models/{FORGED}/predict", 404))
    assert "\n" not in line and "\x00" not in line and "\x1b" not in line
    assert "\\nCRITICAL batchserve [None]: forged\\x00\\r\\t\\x1b[31m" in line


def test_a_traceback_keeps_its_lines() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = record("failed on %s", FORGED)
        rec.exc_info = sys.exc_info()
    text = TextFormatter("%(message)s").format(rec)
    first, *rest = text.splitlines()
    assert first.startswith("failed on x\\nCRITICAL") and rest[0].startswith("Traceback")


def test_json_lines_carry_control_characters_escaped() -> None:
    line = JsonFormatter().format(record("path %s", FORGED))
    assert "\n" not in line and "\x00" not in line
    assert json.loads(line)["message"] == f"path {FORGED}"
