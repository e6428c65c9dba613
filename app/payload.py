"""The ``{"instances": [...]}`` envelope that /predict requests and jobs share."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import simdjson

from app.arrays import listed_rows
from app.errors import InvalidInput, PayloadTooLarge


def parse_json(body: bytes) -> Any:
    if not body:
        raise InvalidInput("request body is empty; expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None


F32_MAX = float(np.finfo(np.float32).max)


class DenseRows(list[np.ndarray]):
    """``dense_instances``' rows: float32 views of one array, every value finite and within
    float32's range, so a tensor model's decode takes them as they are."""

    @classmethod
    def of(cls, array: np.ndarray) -> DenseRows:
        """``array``'s rows (``listed_rows``)."""
        return cls(listed_rows(array))


def dense_instances(body: bytes, width: int, max_instances: int) -> DenseRows | None:
    """The instances of ``{"instances": [...]}`` when every one is a flat array of ``width``
    numbers that float32 holds: float32 rows of one array, which simdjson parses from the body
    straight into a buffer, building no Python number, and a tensor model's decode takes as
    they are. Against ``parse_json`` and the model's decode that is 2.2 x faster for one
    512-number instance and 3.5 x for larger bodies (docs/benchmarks.md, "Body parsing").

    None for anything else (other JSON, other lengths, other values, numbers past float32's
    range, no instances, more than ``max_instances``): ``parse_json`` and ``instances_of`` then
    take the body, and the model's decode names what is wrong. The numbers are never visited
    one by one: the body holds no ``[`` but the list's and the rows', each row is an array of
    ``width`` elements, so none of them is an array, and ``as_buffer`` refuses any that is not
    a number. (Where a body repeats the key "instances", simdjson reads the first and orjson
    the last; RFC 8259 leaves that open.)"""
    if body.startswith(b"\xef\xbb\xbf"):  # simdjson skips a byte order mark; JSON has none
        return None
    if may_hold_booleans(body):  # simdjson reads true and false as 1 and 0: not numbers here
        return None
    try:
        document = simdjson.Parser().parse(body)
        if not isinstance(document, simdjson.Object):
            return None
        instances = document.get("instances")
        if not isinstance(instances, simdjson.Array):
            return None
        n = len(instances)
        if not 0 < n <= max_instances or not _brackets_are(body, 1 + n):
            return None
        for row in instances:
            if not isinstance(row, simdjson.Array) or len(row) != width:
                return None
        flat = np.frombuffer(instances.as_buffer(of_type="d"), dtype=np.float64)
    except (ValueError, TypeError, RuntimeError):  # not JSON, not a number, too big an integer
        return None
    if not np.abs(flat).max() <= F32_MAX:
        return None
    return DenseRows.of(flat.astype(np.float32).reshape(n, width))


_U, _F = ord("u"), ord("f")


def may_hold_booleans(body: bytes) -> bool:
    """False where ``body`` holds no JSON ``true`` or ``false``. Outside strings they are the
    only JSON spelled with a "u" or an "f" (``null`` too); a search for one byte is a quarter
    of one for a word (4 KiB: 1.1 against 4.5 us for both). The byte is given as its number:
    ``b"u" in body`` first tries ``b"u"`` as one and formats the TypeError (0.56 against 0.11
    us for both)."""
    return _U in body or _F in body


def _brackets_are(body: bytes, count: int) -> bool:
    """Whether ``body`` holds exactly ``count`` "[": one search for each from the last, where
    ``bytes.count`` looks at every byte (one 512-number row: 1.2 against 3.7 us)."""
    at = -1
    for _ in range(count):
        at = body.find(b"[", at + 1)
        if at < 0:
            return False
    return body.find(b"[", at + 1) < 0


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
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT64:
        raise InvalidInput(f"{what} must be a whole number >= 0 (at most 2^63 - 1), got "
                           f"{json_text(value)}")
    return value


MAX_INT64 = 2**63 - 1  # the protocol's integers (sizes, parameters) are int64


# The most characters of a value a message shows: an error answer stays small, whatever the
# request sent in the field it names (megabytes of it, at most max_body_bytes).
SHOWN_CHARS = 80


def json_text(value: Any) -> str:
    """``value`` as JSON writes it, for messages (``true``, ``"5"``, ``1e+30``: past 64 bits a
    JSON number is read as a float), not as Python does (``True``, ``'5'``); past
    ``SHOWN_CHARS``, its beginning and its length."""
    if isinstance(value, (bool, str)) or value is None:
        text = orjson.dumps(value).decode()
    elif isinstance(value, (list, dict)):
        text = json.dumps(value, ensure_ascii=False)  # orjson stops at 64-bit integers
    else:
        text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def first_boolean(instances: list[Any]) -> int | None:
    """The index of the first instance holding a JSON true or false anywhere, or None. numpy
    would take them for 1 and 0 beside numbers; a numeric model's instances hold numbers only."""
    def has(value: Any) -> bool:
        if type(value) is bool:
            return True
        return type(value) is list and any(has(v) for v in value)

    return next((i for i, instance in enumerate(instances) if has(instance)), None)


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
