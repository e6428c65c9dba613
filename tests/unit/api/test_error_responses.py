"""app/api/error_responses.py: every exception as a response, in the form of its protocol."""

from __future__ import annotations

import orjson
import pytest
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from app.api.error_responses import (
    BATCHSERVE,
    V2,
    ErrorFormat,
    error_response,
    format_for_path,
)
from app.errors import InvalidInput, Unauthorized, Unavailable, WouldMissDeadline


def test_a_serve_error_keeps_its_status_type_and_retry_after() -> None:
    busy = error_response(Unavailable("busy", "the queue is full"))
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert orjson.loads(busy.body) == {"error": {"type": "busy", "message": "the queue is full"}}
    late = error_response(WouldMissDeadline("the queue ahead outlasts it", 7))
    assert late.status_code == 503 and late.headers["retry-after"] == "7"


def test_a_missing_token_asks_for_a_bearer() -> None:
    response = error_response(Unauthorized("missing bearer token"))
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"


def test_the_v2_protocol_answers_400_for_a_client_mistake_in_its_own_form() -> None:
    response = error_response(InvalidInput("shape [3] does not fit 4 values"), V2)
    assert response.status_code == 400
    assert orjson.loads(response.body) == {"error": "shape [3] does not fit 4 values"}
    assert "retry-after" not in response.headers


@pytest.mark.parametrize("fmt", [BATCHSERVE, V2])
def test_a_message_that_quotes_megabytes_is_answered_in_a_kilobyte(fmt: ErrorFormat) -> None:
    """A message quoting what a client sent (a name of a megabyte) is cut (``bounded``)."""
    response = error_response(InvalidInput(f"unexpected inference input '{'I' * 10**6}'"), fmt)
    assert response.status_code == fmt.status_of(422) and len(response.body) < 1_200
    assert b"unexpected inference input 'IIII" in response.body


def test_starlettes_own_errors_get_a_type_and_their_headers() -> None:
    response = error_response(HTTPException(405, "Method Not Allowed", {"Allow": "POST"}))
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    response = error_response(HTTPException(405, headers={"Allow": "HEAD, POST, GET"}))
    assert response.headers["allow"] == "GET, HEAD, POST"  # one order, whatever a set's
    assert orjson.loads(response.body)["error"] == {"type": "method_not_allowed",
                                                    "message": "Method Not Allowed"}
    assert orjson.loads(error_response(HTTPException(418)).body)["error"]["type"] == \
        "http_error"


def test_a_validation_error_names_each_field() -> None:
    """What FastAPI raises for a route with typed parameters: one 422 naming every field."""
    exc = RequestValidationError([
        {"loc": ("query", "ready"), "msg": "Input should be a valid boolean"},
        {"loc": ("path", "version"), "msg": "Input should be a valid integer"},
    ])
    response = error_response(exc)
    assert response.status_code == 422
    assert orjson.loads(response.body)["error"] == {
        "type": "invalid_input",
        "message": "query.ready: Input should be a valid boolean; path.version: Input should "
                   "be a valid integer"}
    assert error_response(exc, V2).status_code == 400


@pytest.mark.parametrize("fmt", [BATCHSERVE, V2])
def test_an_unexpected_error_is_a_bare_500_that_tells_nothing(fmt: ErrorFormat) -> None:
    response = error_response(KeyError("/srv/app/secret.py line 3"), fmt)
    assert response.status_code == 500
    assert b"secret" not in response.body and b"internal server error" in response.body


def test_the_path_names_the_protocol_where_no_route_matched() -> None:
    assert format_for_path("/v2") is V2 and format_for_path("/v2/models/x/infer") is V2
    assert format_for_path("/v2x") is BATCHSERVE and format_for_path("/predict") is BATCHSERVE
