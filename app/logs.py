"""Logging set-up: plain text or one JSON object per line."""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
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


# A connection reset because its client took none of its answer (app/flow.py).
STALLED = ("A client took none of its answer within read_timeout_s (5 s at least); "
           "connection reset.")
# grpcio logs an error with a traceback when a call's answer cannot be sent because the call
# ended under it (its client gone) before grpcio saw the end: GrpcUnsent makes it this line.
GRPC_UNSENT_PREFIX = "ExecuteBatchError raised in core by servicer method"
GRPC_UNSENT = "A gRPC call's answer could not be sent; the call ended before it went."
# uvicorn's warnings that a client sets off at will, one a request: a connection past
# max_connections (answered 503), a request httptools cannot parse (400); and STALLED. A flood
# of any wrote a line a request: 10,000 lines a second, and a quarter of the CPU each
# refusal cost.
INVALID_HTTP = "Invalid HTTP request received."
FLOODABLE = ("Exceeded concurrency limit.", INVALID_HTTP, STALLED)
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


class GrpcUnsent(logging.Filter):
    """grpcio's error for an answer it could not send (``GRPC_UNSENT_PREFIX``, a traceback of
    grpcio's own code each time) as ``GRPC_UNSENT``, a warning without the traceback, for
    ``Repeats`` to hold back: a client can set it off at will, once a connection it drops
    while answers are on their way."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if isinstance(message, str) and message.startswith(GRPC_UNSENT_PREFIX):
            if not logging.getLogger(record.name).isEnabledFor(logging.WARNING):
                return False
            record.msg, record.args = GRPC_UNSENT, None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


# Control characters as escapes: a line of the text log is one record, whatever a request's path,
# model name or body put in its message (a decoded %0a would otherwise start a forged line; %C2%85
# and %E2%80%A8, NEL and the line separator, end a line for readers that split on Unicode's).
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def escape_controls(text: str) -> str:
    return text if text.isprintable() else text.translate(_ESCAPES)


class Stamps:
    """A time as ``fmt`` then its milliseconds, the second's text made once a second (at
    info a server logs a line a request: strftime each time was a tenth of a line's cost)."""

    def __init__(self, fmt: str, convert: Callable[[float], time.struct_time]) -> None:
        self._fmt, self._convert = fmt, convert
        self._last: tuple[int, str] = (-1, "")  # a second and its text, swapped whole

    def __call__(self, created: float) -> str:
        second = int(created)
        known, text = self._last
        if known != second:
            text = time.strftime(self._fmt, self._convert(second))
            self._last = (second, text)
        return f"{text}{int((created - second) * 1000):03d}"


class TextFormatter(logging.Formatter):
    """The text log: ``time level logger [request id]: message``, the message on one line,
    control characters escaped (a traceback, added after the message, keeps its lines)."""

    def __init__(self) -> None:
        super().__init__()
        self._time = Stamps("%Y-%m-%d %H:%M:%S,", time.localtime)

    def line(self, created: float, level: str, name: str, rid: str | None, message: str) -> str:
        return f"{self._time(created)} {level} {name} [{rid}]: {escape_controls(message)}"

    def usesTime(self) -> bool:  # noqa: N802 - logging's name; ``line`` writes the time
        return False

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return self.line(record.created, record.levelname, record.name,
                         getattr(record, "request_id", None), record.message)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request fields when present."""

    def __init__(self) -> None:
        super().__init__()
        self._time = Stamps("%Y-%m-%dT%H:%M:%S.", time.gmtime)

    def line(self, created: float, level: str, name: str, message: str,
             fields: dict[str, object], exception: str | None = None) -> str:
        entry: dict[str, object] = {"time": f"{self._time(created)}Z", "level": level.lower(),
                                    "logger": name, "message": message}
        entry.update((k, v) for k, v in fields.items() if v is not None)
        if exception is not None:
            entry["exception"] = exception
        return orjson.dumps(entry).decode()

    def format(self, record: logging.LogRecord) -> str:
        return self.line(record.created, record.levelname, record.name, record.getMessage(),
                         {name: getattr(record, name, None) for name in _FIELDS},
                         self.formatException(record.exc_info) if record.exc_info else None)


WRITE_EVERY_S = 0.05  # how often the writer writes what waits (a warning: at once)
BUFFER_LINES = 10_000  # what may wait for a stream that takes nothing; past it, lines are dropped
FLUSH_WAIT_S = 2.0  # the longest ``flush`` (at exit) waits for a stream that takes nothing


class WriterHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler whose lines a thread of its own writes: no thread that logs ever waits
    on the stream. A reader that stops reading (a container's log pipe that its collector no
    longer drains, a terminal paused) filled the pipe, and the next write then held the event
    loop: the server answered nothing, health checks included. Here at most ``BUFFER_LINES``
    wait for such a stream; further lines are dropped and counted, and a line says how many
    once the stream takes lines again.

    The writer writes what waits every ``WRITE_EVERY_S``, in one write (at info a server logs
    a line a request: one write each was 13 % of a front end's samples, and woke the reader
    each time), and a WARNING or above at once, after the lines before it. A logging thread
    only appends to a deque: a lock the writer also took, taken a line, made the two convoy
    on the GIL (1.5 us more a line). ``flush`` (at exit) writes what waits, waiting at most
    ``FLUSH_WAIT_S``."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._lines: deque[str] = deque()
        self._dropped = 0  # a count for the reader: two threads' drops at once may count one
        self._now = threading.Event()  # a warning or a flush waits
        self._writing = False
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.queue(self.format(record), record.levelno)
        except RecursionError:  # as logging's own handlers do
            raise
        except Exception:  # noqa: BLE001 - a log line that cannot be made is reported
            self.handleError(record)

    def queue(self, line: str, level: int) -> None:
        """A line made (by ``emit``, or ``log_access``) for the writer."""
        if len(self._lines) >= BUFFER_LINES:
            self._dropped += 1
            return
        self._lines.append(line + self.terminator)
        if level >= logging.WARNING:
            self._now.set()
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._starting:
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_forever, daemon=True,
                                                name="batchserve-log")
                self._thread.start()

    def _write_forever(self) -> None:
        while True:
            self._now.wait(WRITE_EVERY_S)
            self._now.clear()
            self._write_waiting()

    def _write_waiting(self) -> None:
        self._writing = True  # before a line is taken: ``flush`` never sees them gone unwritten
        try:
            parts = []
            take = self._lines.popleft
            while True:
                try:
                    parts.append(take())
                except IndexError:
                    break
            dropped, self._dropped = self._dropped, 0
            if dropped:
                parts.append(f"{dropped} log lines dropped after the line above: the log's "
                             f"reader did not keep up{self.terminator}")
            if parts:
                self.stream.write("".join(parts))
                self.stream.flush()
        except Exception:  # noqa: BLE001 - as emit reports its own
            self.handleError(logging.makeLogRecord({"msg": "log lines"}))
        finally:
            self._writing = False

    def flush(self) -> None:
        """Write what waits (logging.shutdown's, at exit), waiting at most ``FLUSH_WAIT_S``."""
        if self._thread is None:
            return
        self._now.set()
        deadline = time.monotonic() + FLUSH_WAIT_S
        while (self._lines or self._dropped or self._writing) and time.monotonic() < deadline:
            time.sleep(0.001)


def configure_logging(level: str, fmt: str) -> None:
    """Send every logger (ours, uvicorn's, Python's warnings) to stderr as text or JSON lines,
    written by a thread of their own (``WriterHandler``), and the warnings a client can set off
    once a request (``FLOODABLE``, grpcio's ``GrpcUnsent``) at most once a
    ``REPEAT_WINDOW_S``, with a count."""
    handler = WriterHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    # Neither format shows the caller's file and line, thread or process: logging then skips
    # finding them for each record (logging's documented switches), a quarter to a third of
    # what an access log line costs (about 5 us of 16-25, a line a request at info).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Python's warnings (a model's, torch's) as log lines too: one JSON object a line stays so,
    # and none is written to stderr by the thread that warns.
    logging.captureWarnings(True)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.filters[:] = [f for f in uvicorn_log.filters if not isinstance(f, Repeats)]
    uvicorn_log.addFilter(Repeats(FLOODABLE, REPEAT_WINDOW_S))
    grpc_log = logging.getLogger("grpc._cython.cygrpc")
    grpc_log.filters[:] = [GrpcUnsent(), Repeats((GRPC_UNSENT,), REPEAT_WINDOW_S)]
