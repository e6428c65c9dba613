"""Logging set-up: plain text or one JSON object per line."""

from __future__ import annotations

import contextvars
import logging
import sys
import time

import orjson

_FIELDS = ("request_id", "method", "path", "status", "duration_ms", "client")

# The id of the request being handled (set by app.api.access), for every log line written meanwhile.
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
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


def configure_logging(level: str, fmt: str) -> None:
    """Send every logger (ours and uvicorn's) to stderr as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
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
    # A front end's proxy to its device process logs each hop at info; the access log has it.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
