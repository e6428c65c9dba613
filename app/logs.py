"""Logging set-up: plain text or one JSON object per line."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import time
from typing import TextIO

import orjson

_FIELDS = ("request_id", "method", "path", "status", "duration_ms", "client")

# The id of the request being handled (set by app.api.access), for every log line written meanwhile.
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


# uvicorn's warnings that a client sets off at will, one a request: a connection past
# max_connections (answered 503), a request httptools cannot parse (400). A flood of either
# wrote a line a request: 10,000 lines a second, and a quarter of the CPU each refusal cost.
FLOODABLE = ("Exceeded concurrency limit.", "Invalid HTTP request received.")
REPEAT_WINDOW_S = 10.0


class Repeats(logging.Filter):
    """Lets one record of each of ``messages`` through a ``window_s``: the first at once, and
    the first after the window, which tells how many were held back since the last."""

    def __init__(self, messages: tuple[str, ...], window_s: float) -> None:
        super().__init__()
        self.window_s = window_s
        self._next: dict[str, float] = dict.fromkeys(messages, 0.0)  # the next line's earliest
        self._held: dict[str, int] = dict.fromkeys(messages, 0)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        due = self._next.get(message) if isinstance(message, str) else None
        if due is None:
            return True
        now = time.monotonic()
        if now < due:
            self._held[message] += 1
            return False
        self._next[message] = now + self.window_s
        held, self._held[message] = self._held[message], 0
        if held:
            record.msg = f"{message} ({held} more since the last such line, not logged)"
        return True


# Control characters as escapes: a line of the text log is one record, whatever a request's path,
# model name or body put in its message (a decoded %0a would otherwise start a forged line).
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def escape_controls(text: str) -> str:
    return text.translate(_ESCAPES)


class TextFormatter(logging.Formatter):
    """The text log: each record's message on one line, control characters escaped (a
    traceback, added after the message, keeps its lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request fields when present."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class PassHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes the lines an event loop's pass logs below WARNING in one
    write at the pass's end (a callback it schedules then), not one write each: at info a
    server logs a line a request, and each write to the pipe a container's logs are read from
    was 13 % of a front end's samples and woke the reader; so written, a process serves
    about 1.07 x the requests at info (docs/benchmarks.md, "Whole server"). A line of WARNING
    or above, or from a thread with no running loop, is written at once, after those
    waiting, so the order stays; so is what waits on another loop (one that may be gone),
    and everything at ``flush`` (at exit)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._lines: list[str] = []
        self._due: asyncio.AbstractEventLoop | None = None  # whose pass's end writes them

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record) + self.terminator)
            try:
                loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is None or record.levelno >= logging.WARNING or (
                    self._due is not None and self._due is not loop):
                self._write()
            elif self._due is None:
                self._due = loop
                loop.call_soon(self._pass_done)
        except RecursionError:  # as logging's own handlers do
            raise
        except Exception:  # noqa: BLE001 - a log line that cannot be written is reported
            self.handleError(record)

    def _pass_done(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # logging creates it in __init__
            try:
                self._write()
            except Exception:  # noqa: BLE001 - as emit reports its own
                self.handleError(logging.makeLogRecord({"msg": "log lines of a pass"}))

    def _write(self) -> None:
        """What waits, in one write, and flush (under the handler's lock)."""
        self._due = None
        text = "".join(self._lines)
        self._lines.clear()
        if text:
            self.stream.write(text)
        self.stream.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self.stream and hasattr(self.stream, "flush"):
                self._write()


def configure_logging(level: str, fmt: str) -> None:
    """Send every logger (ours and uvicorn's) to stderr as text or JSON lines, the lines of an
    event loop's pass in one write (``PassHandler``), and the warnings a client can set off
    once a request (``FLOODABLE``) at most once a ``REPEAT_WINDOW_S``, with a count."""
    handler = PassHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(
            "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
        ))
    # Neither format shows the caller's file and line, thread or process: logging then skips
    # finding them for each record (logging's documented switches), a quarter to a third of
    # what an access log line costs (about 5 us of 16-25, a line a request at info).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.filters[:] = [f for f in uvicorn_log.filters if not isinstance(f, Repeats)]
    uvicorn_log.addFilter(Repeats(FLOODABLE, REPEAT_WINDOW_S))
