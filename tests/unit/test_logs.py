"""Log lines: one record per line whatever a request puts in it, in text and JSON; written by a
thread of their own, which a stream that takes nothing never makes a logging thread wait on
(``WriterHandler``)."""

from __future__ import annotations

import ast
import io
import json
import logging
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.logs import (
    FLOODABLE,
    GRPC_UNSENT,
    JsonFormatter,
    Repeats,
    TextFormatter,
    WriterHandler,
    configure_logging,
)
from tests.conftest import isolated_logging, wait_until_sync


@pytest.fixture(autouse=True)
def _warnings_shown_as_before() -> Iterator[None]:
    yield
    logging.captureWarnings(False)  # configure_logging's, for the tests after


FORGED = "x\nCRITICAL batchserve [None]: forged\x00\r\t\x1b[31m"


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("batchserve.access", logging.INFO, __file__, 1, message, args, None)


def test_text_lines_escape_control_characters_from_requests() -> None:
    line = TextFormatter().format(
        record('%s "%s %s" %d', "127.0.0.1", "POST", f"/models/{FORGED}/predict", 404))
    assert "\n" not in line and "\x00" not in line and "\x1b" not in line
    assert "\\nCRITICAL batchserve [None]: forged\\x00\\r\\t\\x1b[31m" in line
    # What ends a line for a reader that splits on Unicode's line breaks (str.splitlines).
    for breaking in ("\x85", "\u2028", "\u2029", "\x1c", "\x9b"):
        line = TextFormatter().format(record("GET /models/a%sCRITICAL forged", breaking))
        assert len(line.splitlines()) == 1 and line.endswith("a\\" + ascii(breaking)[2:-1]
                                                            + "CRITICAL forged"), line


def test_each_line_has_its_own_time_to_the_millisecond() -> None:
    """The second's text is made once a second: lines within one second and across seconds
    read as logging's own time stamps would (local time in text, UTC in JSON)."""
    text, json_lines = TextFormatter(), JsonFormatter()
    for created in (1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_001.0625,
                    1_699_999_999.25):
        rec = record("x")
        rec.created, rec.msecs = created, int((created - int(created)) * 1000)
        ms = f"{rec.msecs:03d}"
        assert text.format(rec).startswith(f"{logging.Formatter().formatTime(rec)} ")
        assert json.loads(json_lines.format(rec))["time"] == time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{ms}Z"


def test_a_traceback_keeps_its_lines() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = record("failed on %s", FORGED)
        rec.exc_info = sys.exc_info()
    text = TextFormatter().format(rec)
    first, *rest = text.splitlines()
    assert first.endswith(": failed on x\\nCRITICAL batchserve [None]: forged\\x00\\r\\t\\x1b[31m")
    assert rest[0].startswith("Traceback")


def test_json_lines_carry_control_characters_escaped() -> None:
    line = JsonFormatter().format(record("path %s", FORGED))
    assert "\n" not in line and "\x00" not in line
    assert json.loads(line)["message"] == f"path {FORGED}"


class Writes(io.StringIO):
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)


def handler_on(stream: Writes) -> WriterHandler:
    handler = WriterHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    return handler


def at(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("batchserve", level, __file__, 1, message, (), None)


def test_lines_are_gathered_and_written_in_one_write_by_the_writer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.logs.WRITE_EVERY_S", 600.0)  # only a warning or a flush writes
    stream = Writes()
    handler = handler_on(stream)
    for i in range(3):
        handler.handle(at(logging.INFO, f"request {i}"))
    assert stream.writes == []
    handler.flush()
    assert stream.writes == ["INFO request 0\nINFO request 1\nINFO request 2\n"]
    handler.handle(at(logging.DEBUG, "later"))
    handler.flush()
    assert stream.writes[1:] == ["DEBUG later\n"]


def test_a_warning_is_written_at_once_after_the_lines_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.logs.WRITE_EVERY_S", 600.0)  # the warning wakes the writer
    stream = Writes()
    handler = handler_on(stream)
    handler.handle(at(logging.INFO, "first"))
    handler.handle(at(logging.WARNING, "second"))
    wait_until_sync(lambda: stream.writes, "the warning written")
    assert stream.writes == ["INFO first\nWARNING second\n"]


def test_lines_from_any_thread_keep_their_order_and_flush_writes_them() -> None:
    stream = Writes()
    handler = handler_on(stream)
    handler.handle(at(logging.INFO, "main"))
    thread = threading.Thread(target=handler.handle, args=(at(logging.INFO, "thread"),))
    thread.start()
    thread.join()
    handler.flush()  # logging.shutdown's, at exit
    assert "".join(stream.writes) == "INFO main\nINFO thread\n"


class Stalled(Writes):
    """A stream that takes nothing until ``go`` is set: a log pipe nobody reads."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.entered = threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        assert self.go.wait(60), "never let go"
        return super().write(text)


def test_a_stream_that_takes_nothing_holds_no_thread_that_logs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its writes wait; logging does not: past BUFFER_LINES lines are dropped and counted,
    then said once the stream takes lines again. A flush waits FLUSH_WAIT_S at most."""
    monkeypatch.setattr("app.logs.BUFFER_LINES", 7)
    monkeypatch.setattr("app.logs.FLUSH_WAIT_S", 0.1)
    stream = Stalled()
    handler = handler_on(stream)
    handler.handle(at(logging.WARNING, "taken by the writer, which then waits"))
    wait_until_sync(stream.entered.is_set, "the writer waiting on the stream")
    started = time.monotonic()
    for i in range(50):
        handler.handle(at(logging.INFO, f"line {i:02d}"))
    handler.flush()
    assert time.monotonic() - started < 30.0 and stream.writes == []  # nothing waited on it
    stream.go.set()
    wait_until_sync(lambda: len(stream.writes) == 2, "the stream takes lines again")
    kept = "".join(f"INFO line {i:02d}\n" for i in range(7))
    assert stream.writes[1] == (kept + "43 log lines dropped after the line above: the log's "
                                "reader did not keep up\n")


LEVELS = {"debug", "info", "warning", "error", "critical", "exception", "log"}


def test_no_log_call_passes_an_error_it_caught() -> None:
    """A record keeps its arguments: an error among them keeps its traceback, the frames and
    their locals (a model, a replica, a request) for as long as a handler keeps the record
    (pytest's, a memory handler). Calls pass its text."""
    app = Path(__file__).resolve().parents[2] / "app"
    found = []
    for path in sorted(app.rglob("*.py")):
        for handler in ast.walk(ast.parse(path.read_text())):
            if not isinstance(handler, ast.ExceptHandler) or handler.name is None:
                continue
            for call in ast.walk(handler):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr in LEVELS
                        and any(isinstance(a, ast.Name) and a.id == handler.name
                                for a in call.args)):
                    found.append(f"{path.relative_to(app.parent)}:{call.lineno}")
    assert found == []


def test_a_flood_of_one_warning_is_one_line_a_window_with_its_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past max_connections uvicorn warns once a refused request: the first goes out, the rest
    of its window are counted and told in the first line after it; other messages pass."""
    now = [100.0]
    monkeypatch.setattr("app.logs.time.monotonic", lambda: now[0])
    repeats = Repeats(("Exceeded concurrency limit.",), 10.0)

    def passed(message: str) -> str | None:
        rec = logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, message, (), None)
        return rec.getMessage() if repeats.filter(rec) else None

    assert passed("Exceeded concurrency limit.") == "Exceeded concurrency limit."
    assert [passed("Exceeded concurrency limit.") for _ in range(5)] == [None] * 5
    assert passed("Invalid HTTP request received.") == "Invalid HTTP request received."
    now[0] = 109.9
    assert passed("Exceeded concurrency limit.") is None
    now[0] = 110.0
    assert passed("Exceeded concurrency limit.") == \
        "Exceeded concurrency limit. (6 more since the last such line, not logged)"
    now[0] = 500.0
    assert passed("Exceeded concurrency limit.") == "Exceeded concurrency limit."


def test_uvicorns_floodable_warnings_are_held_back_however_often_logging_is_set_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    uvicorn_log = logging.getLogger("uvicorn.error")
    monkeypatch.setattr(uvicorn_log, "filters", [])
    monkeypatch.setattr(uvicorn_log, "isEnabledFor", lambda level: True)  # whatever a test set
    root, stream = isolated_logging(monkeypatch)
    configure_logging("warning", "text")
    configure_logging("warning", "text")
    assert [type(f) for f in uvicorn_log.filters] == [Repeats]
    # The server's handler on this logger itself: a test that ran uvicorn with its own
    # logging config left "uvicorn" not passing records up to the root.
    handler = root.handlers[0]
    monkeypatch.setattr(uvicorn_log, "handlers", [handler])
    monkeypatch.setattr(uvicorn_log, "propagate", False)
    for message in FLOODABLE:
        for _ in range(20):
            uvicorn_log.warning(message)
    handler.flush()
    assert [line.rsplit(": ", 1)[1] for line in stream.getvalue().splitlines()] == \
        list(FLOODABLE)


def test_grpcios_unsent_answers_are_a_warning_line_held_back_without_traceback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    grpc_log = logging.getLogger("grpc._cython.cygrpc")
    monkeypatch.setattr(grpc_log, "filters", [])
    root, stream = isolated_logging(monkeypatch)
    configure_logging("warning", "text")
    monkeypatch.setattr(grpc_log, "handlers", [root.handlers[0]])
    monkeypatch.setattr(grpc_log, "propagate", False)
    monkeypatch.setattr(grpc_log, "isEnabledFor", lambda level: level >= logging.WARNING)
    for _ in range(5):
        try:
            raise RuntimeError("Failed execute_batch")
        except RuntimeError:  # as grpcio logs it: _LOGGER.exception(message % method)
            grpc_log.exception("ExecuteBatchError raised in core by servicer method "
                               "[/inference.GRPCInferenceService/ModelInfer]")
    grpc_log.error("Unexpected [KeyError] raised by servicer method [/x]")
    root.handlers[0].flush()
    lines = stream.getvalue().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        f"WARNING grpc._cython.cygrpc [None]: {GRPC_UNSENT}",
        "ERROR grpc._cython.cygrpc [None]: Unexpected [KeyError] raised by servicer method [/x]"]
    monkeypatch.setattr(grpc_log, "isEnabledFor", lambda level: level >= logging.ERROR)
    grpc_log.error("ExecuteBatchError raised in core by servicer method [/y]")
    root.handlers[0].flush()
    assert len(stream.getvalue().splitlines()) == 2  # at level error, no warning


def test_pythons_warnings_are_log_lines_one_json_object_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A warning a model or torch raises while serving goes through the handler, as any line:
    in the JSON log one object, not a raw line that breaks it."""
    root, stream = isolated_logging(monkeypatch)
    logging.captureWarnings(False)
    try:
        configure_logging("warning", "json")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a model's warning\nover two lines", UserWarning, stacklevel=1)
        root.handlers[0].flush()
    finally:
        logging.captureWarnings(False)
    [line] = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["logger"] == "py.warnings" and "a model's warning" in entry["message"]
