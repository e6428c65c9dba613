"""The ``{"instances": [...]}`` envelope that /predict requests and jobs share."""

from __future__ import annotations

from typing import Any

import orjson

from app.errors import InvalidInput, PayloadTooLarge


def parse_json(body: bytes) -> Any:
    if not body:
        raise InvalidInput("request body is empty; expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None


def json_object(text: bytes | str, what: str = "request") -> dict[str, Any]:
    """``text`` parsed as a JSON object; InvalidInput naming ``what`` otherwise."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return value


def whole_number_of(value: Any, what: str) -> int | None:
    """A whole number >= 0 a JSON body gives (``what`` names the field), or None if absent: a
    priority (0: the model's default level; app/served.py checks the range) or a timeout."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{what} must be a whole number >= 0, got {value!r}")
    return value


def instances_of(payload: Any, max_instances: int) -> list[Any]:
    """``payload["instances"]``, checked: a non-empty list of at most ``max_instances``."""
    if not isinstance(payload, dict):
        raise InvalidInput('expected a JSON object {"instances": [...]}')
    if "instances" not in payload:
        raise InvalidInput('missing field "instances": expected {"instances": [...]}')
    instances = payload["instances"]
    if not isinstance(instances, list):
        raise InvalidInput('"instances" must be a list')
    if not instances:
        raise InvalidInput('"instances" is empty; send at least one instance')
    if len(instances) > max_instances:
        raise PayloadTooLarge(
            f"{len(instances)} instances is more than the limit of {max_instances} per request"
        )
    return instances
