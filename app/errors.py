"""Everything batchserve raises on purpose derives from ``BatchServeError``.

Start-up errors (``ConfigError``, ``ModelLoadError``) carry a one-line message that the command line
prints as it is. Request errors (``ServeError`` and its subclasses) carry their HTTP status and a
message that is safe to show a client.
"""

from __future__ import annotations

import os

# The most of an error message a client is sent, in bytes of UTF-8: a message may quote what the
# client sent (a name, a shape), which may be megabytes, and gRPC sends it in a header, which a
# client refuses past 16 KiB (8 KiB is its soft limit; percent-encoding may triple the bytes).
MAX_MESSAGE_BYTES = 1024
_KEPT_AT_END = 256  # of those, the message's end: where it says what is wrong with the value
QUOTED_BYTES = 40  # of a header's value a message quotes


def bounded(message: str) -> str:
    """``message`` as a client is sent it: at most MAX_MESSAGE_BYTES of UTF-8, the middle cut
    where it is longer (a quoted value's), saying how much was cut."""
    if len(message) <= MAX_MESSAGE_BYTES // 4:  # four bytes a character at most
        return message
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_MESSAGE_BYTES:
        return message
    # the note is given the room it would take if the whole message were cut, so that head,
    # note and tail together fit
    room = MAX_MESSAGE_BYTES - _KEPT_AT_END - len(_note(len(message)))
    head = data[:room].decode("utf-8", "ignore")
    tail = data[-_KEPT_AT_END:].decode("utf-8", "ignore")
    return head + _note(len(message) - len(head) - len(tail)) + tail


def _note(cut: int) -> str:
    return f" ... ({cut} characters cut) ... "


def quoted(value: bytes) -> str:
    """A header's value as a message quotes it: its first QUOTED_BYTES, as UTF-8 where they are
    (a client's "５" reads as itself, not as the three Latin-1 characters of its bytes), each
    other byte escaped."""
    text = value[:QUOTED_BYTES].decode("utf-8", "backslashreplace")
    return f"'{text}...'" if len(value) > QUOTED_BYTES else f"'{text}'"


class BatchServeError(Exception):
    """Base of every error batchserve raises on purpose; ``message`` is one readable line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(BatchServeError):
    """Settings that cannot work together, or a config file that cannot be read."""


def first_line(exc: BaseException) -> str:
    """An error in one line for a log or stderr line: its message's first, else its type's
    name (torch's and Redis's messages run over several lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def os_reason(exc: OSError) -> str:
    """An OS error in words for a ConfigError's line: "Address already in use", not its repr.
    A name that does not resolve has a negative errno (getaddrinfo's), which ``os.strerror``
    does not know: its own words then, without ``create_server``'s note of the address."""
    if exc.errno is not None and exc.errno > 0:
        return os.strerror(exc.errno)
    return (exc.strerror or str(exc)).split(" (while attempting to bind", 1)[0]


class ModelLoadError(BatchServeError):
    """The model setting names something that cannot be served."""


class ServeError(BatchServeError):
    """A request's failure: ``status`` and ``type`` go to the client with ``message``."""

    status: int = 500
    type: str = "internal_error"
    retry_after_s: int | None = None

    @property
    def reason(self) -> str:
        """What ``batchserve_rejected_total`` counts it under: its type, unless one type has
        several causes an operator tells apart."""
        return self.type


class InvalidInput(ServeError):
    status = 422
    type = "invalid_input"


class PayloadTooLarge(ServeError):
    status = 413
    type = "payload_too_large"


class UnsupportedEncoding(ServeError):
    status = 415
    type = "unsupported_encoding"


class Unauthorized(ServeError):
    status = 401
    type = "unauthorized"


class NotFound(ServeError):
    status = 404
    type = "not_found"


class Unavailable(ServeError):
    """503: the server cannot take the request now; ``type`` is the health status (busy, ...)."""

    status = 503
    retry_after_s = 1

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.type = state


class ReceivingFull(Unavailable):
    """503 busy: the request bodies still arriving in the process fill ``max_receiving_bytes``
    (app/arriving.py); counted apart from a full queue, which the queue's alert is about."""

    def __init__(self, message: str) -> None:
        super().__init__("busy", message)

    @property
    def reason(self) -> str:
        return "receiving"


class WouldMissDeadline(Unavailable):
    """503 at arrival: the request would not be answered before its deadline (predicted from
    the work queued ahead of it), so it is refused now instead of timing out later."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__("deadline", message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ServeError):
    status = 504
    type = "timeout"


class ModelError(ServeError):
    """The model failed on the batch this request rode in. Details go to the log only."""

    status = 500
    type = "model_error"

    def __init__(self, message: str = "the model failed on this request's batch") -> None:
        super().__init__(message)


class Relayed(ServeError):
    """An error another process of the server answered with (the device process, or the app
    behind a gRPC call), as the same status, type and message."""

    def __init__(self, status: int, type_: str, message: str,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.retry_after_s = retry_after_s


def busy(capacity: int, level: int | None = None, room: int | None = None) -> Unavailable:
    if level is None or room is None or room == capacity:
        return Unavailable("busy", f"the queue is full ({capacity} items); retry later")
    return Unavailable("busy", f"the queue has no room at priority {level} (that level may "
                               f"fill {room} places; the queue holds {capacity} at the default "
                               "level); retry later")
