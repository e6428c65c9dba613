"""An inference answer as rendered (app/api/rendered.py): the head and body Starlette's
Response sends."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.responses import Response

from app.api.rendered import Rendered

pytestmark = pytest.mark.asyncio


async def sent(response: Response) -> list[dict[str, Any]]:
    """The ASGI messages ``response`` sends."""
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("an answer reads nothing")

    await response({"type": "http"}, receive, send)
    return messages


@pytest.mark.parametrize("media_type", ["application/json", "application/octet-stream"])
async def test_an_answer_sends_what_starlettes_response_sends(media_type: str) -> None:
    """The same status, headers (names, values, order) and body as Starlette's Response, with
    and without a header of the protocol's before them."""
    body = b'{"predictions": [[0.5, 1.25]]}'
    assert await sent(Rendered(body, media_type.encode())) == await sent(
        Response(body, media_type=media_type))
    first = ((b"inference-header-content-length", b"12"),)
    starlettes = Response(body, media_type=media_type,
                          headers={"Inference-Header-Content-Length": "12"})
    assert await sent(Rendered(body, media_type.encode(), first)) == await sent(starlettes)
    assert Rendered(body, media_type.encode(), first).headers["content-length"] == str(len(body))
