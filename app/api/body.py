"""Reading and parsing request bodies: size limit first, orjson, then shape of the envelope."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import Receive

from app.errors import InvalidInput, PayloadTooLarge


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def read_body(receive: Receive, limit: int, declared: bytes | None = None) -> bytes:
    """The body, or PayloadTooLarge as soon as it is known to exceed ``limit`` bytes.

    ``declared`` is the Content-Length header, if any. ClientGone if the client disconnects.
    """
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if not chunks and not more and len(chunk) <= limit:
            return chunk  # the usual case: the whole body in one message
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)


def parse_json(body: bytes) -> Any:
    if not body:
        raise InvalidInput("request body is empty; expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None


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
