"""The two headers an inference request may carry besides its body's own asks: read
(``X-Request-Timeout``, ``X-Priority``), and as the inference routes' OpenAPI parameters."""

from __future__ import annotations

from typing import Any

from app.errors import InvalidInput, quoted
from app.framing import decimal

# The headers' names as ASGI gives them (bytes, lower case).
TIMEOUT_HEADER = b"x-request-timeout"
PRIORITY_HEADER = b"x-priority"

# The headers as OpenAPI parameters, for the inference routes' operations.
TIMEOUT_PARAMETER: dict[str, Any] = {
    "name": "X-Request-Timeout", "in": "header", "required": False,
    "description": "seconds from arrival to answer; shortens, never lengthens, the model's "
                   "request_timeout_s",
    "schema": {"type": "number", "exclusiveMinimum": 0},
}


def priority_parameter(levels: int | None = None) -> dict[str, Any]:
    """``X-Priority`` as an OpenAPI parameter; ``levels``: the model's priority_levels, where
    the route serves one model known when the schema is built."""
    schema: dict[str, Any] = {"type": "integer", "minimum": 0}
    if levels is not None:
        schema["maximum"] = levels
    return {
        "name": "X-Priority", "in": "header", "required": False,
        "description": "priority level: 1 the most urgent, up to the model's priority_levels; "
                       "0 or absent: the model's default_priority_level",
        "schema": schema,
    }


def request_timeout_s(header: bytes | None, limit_s: float) -> float:
    """The model's timeout, shortened by an ``X-Request-Timeout`` header (seconds) if given."""
    if header is None:
        return limit_s
    try:
        value = float(header)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise InvalidInput(f"{TIMEOUT_HEADER.decode()} must be a positive number of seconds, got "
                           f"{quoted(header)}")
    return min(value, limit_s)


def priority_header(header: bytes | None) -> int | None:
    """``X-Priority: N``: the level a request asks for (1 the most urgent; 0 the default)."""
    if header is None:
        return None
    level = decimal(header)
    if level is None:
        raise InvalidInput(f"{PRIORITY_HEADER.decode()} must be a whole number >= 0, got "
                           f"{quoted(header)}")
    return level
