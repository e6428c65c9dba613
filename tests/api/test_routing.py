"""Raw routes (app/api/routing.py): one implementation, reached directly or through FastAPI."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from fastapi import FastAPI

from app.api import health
from app.api.routing import RawRoute
from app.api.v2 import repository_routes
from app.api.v2 import routes as v2_routes
from tests.conftest import app_client, http_scope, make_settings

pytestmark = pytest.mark.asyncio


async def call(app: Any, path: str, body: bytes, through_fastapi: bool) -> tuple[int, Any]:
    """One request straight to ``app``, or to FastAPI's own stack (middleware and router)."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not messages:  # the client stays connected: a server's receive waits
            await asyncio.Event().wait()
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    handler = FastAPI.__call__ if through_fastapi else type(app).__call__
    await handler(app, http_scope(path, app), receive, send)
    body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], orjson.loads(body_out)


V2_ROW = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/predict", b'{"instances": [[1, 2, 3, 4]]}', 200),
    ("/predict", b'{"instances": [[1]]}', 422),
    ("/predict", b"not json", 422),
    ("/v2/models/linear/infer", V2_ROW, 200),
    ("/v2/models/linear/versions/1/infer", V2_ROW, 200),
    ("/v2/models/linear/infer", b"not json", 400),
    ("/v2/models/linear/versions/9/infer", V2_ROW, 404),
])
async def test_a_raw_route_answers_the_same_on_either_path(path: str, body: bytes,
                                                           status: int) -> None:
    async with app_client(make_settings()) as client:
        app = client.app  # type: ignore[attr-defined]
        direct = await call(app, path, body, through_fastapi=False)
        framework = await call(app, path, body, through_fastapi=True)
    assert direct == framework
    assert direct[0] == status
    if status != 200:  # each protocol's own error form
        assert isinstance(direct[1]["error"], dict if path == "/predict" else str)


async def test_the_openapi_entry_is_the_routes_own() -> None:
    async with app_client(make_settings()) as client:
        app = client.app  # type: ignore[attr-defined]
        routes = [r for r in app.routes if isinstance(r, RawRoute) and r.path == "/predict"]
        schema = (await client.get("/openapi.json")).json()
    assert len(routes) == 1
    operation = schema["paths"]["/predict"]["post"]
    assert operation == routes[0].operation["post"]
    items = operation["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert items["instances"]["items"]["minItems"] == 4  # linear's per-instance schema
    assert "PredictResponse" in schema["components"]["schemas"]


@pytest.mark.parametrize("method, path", [("GET", "/predict"), ("PUT", "/models/linear/predict"),
                                          ("GET", "/v2/models/linear/infer")])
async def test_other_methods_get_a_405_and_log_no_error(
        method: str, path: str, caplog: pytest.LogCaptureFixture) -> None:
    async with app_client(make_settings()) as client:
        r = await client.request(method, path)
    error = r.json()["error"]
    assert r.status_code == 405
    assert error == "Method Not Allowed" if path.startswith("/v2/") \
        else error["type"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


async def test_every_get_answers_head_with_its_status_and_length_alone() -> None:
    """A gateway may check with HEAD, and every HTTP server must take it where it takes GET
    (RFC 9110): the GET's status and length, no body; a 405 there names both; the schema keeps
    the GET alone."""
    async with app_client(make_settings()) as client:
        schema = (await client.get("/openapi.json")).json()
        paths = [p.replace("{name}", "linear").replace("{version}", "1")
                 for p, operations in schema["paths"].items() if "get" in operations]
        assert "/health_check" in paths and "/v2/models/linear/ready" in paths
        for path in [*paths, "/docs", "/redoc", "/openapi.json"]:
            got, head = await client.get(path), await client.head(path)
            assert (head.status_code, head.content) == (got.status_code, b""), path
            if path != "/metrics":  # its counts grew with the GET
                assert head.headers["content-length"] == got.headers["content-length"], path
        r = await client.request("TRACE", "/v2/health/live")
        assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD")
        assert not any("head" in operations for operations in schema["paths"].values())


async def test_a_mounted_app_matches_raw_routes_by_their_pattern() -> None:
    """Under a root path the fixed-path lookup stands aside and Starlette's matching decides."""
    async with app_client(make_settings()) as client:
        app = client.app  # type: ignore[attr-defined]
        scope = {**http_scope("/api/predict", app), "root_path": "/api"}
        route, child = app._match(scope)
        assert route.path == "/predict" and child["path_params"] == {}
        assert app._match({**http_scope("/predict", app), "method": "GET"}) is None
        named, params = app._match(http_scope("/models/linear/predict", app))
        assert named.path == "/models/{name}/predict"
        assert params["path_params"] == {"name": "linear"}


@pytest.mark.parametrize(("path", "error"), [
    ("/v2/models/linear/trace/setting", "Not Found"), ("/v2/nothing", "Not Found"),
    ("/nothing", {"type": "not_found", "message": "Not Found"}),
    ("/v2x", {"type": "not_found", "message": "Not Found"}),
])
async def test_a_path_no_route_matches_is_answered_in_its_protocols_form(
        path: str, error: Any) -> None:
    async with app_client(make_settings()) as client:
        r = await client.get(path)
    assert r.status_code == 404
    assert r.json() == {"error": error}


@pytest.mark.parametrize(("method", "path", "error"), [
    ("POST", "/predict/", {"type": "not_found", "message": "Not Found"}),
    ("GET", "/health_check/", {"type": "not_found", "message": "Not Found"}),
    ("POST", "/v2/models/linear/infer/", "Not Found"),
    ("GET", "/v2/health/ready/", "Not Found"),
])
async def test_a_path_with_a_trailing_slash_is_a_404_not_a_redirect(
        method: str, path: str, error: Any) -> None:
    """A redirect would name this server's host and scheme as the client reached it (http
    behind a TLS gateway) and most clients do not follow one for a POST: the route is not
    there, so say so."""
    async with app_client(make_settings()) as client:
        r = await client.request(method, path, json={"instances": [[1, 2, 3, 4]]})
    assert r.status_code == 404 and "location" not in r.headers
    assert r.json() == {"error": error}


async def test_the_routers_routes_are_the_apps_own() -> None:
    """Each route of health, v2 and the repository is in the app's own list, where its router
    matches it in one step (an included router, FastAPI 0.165's, matches through a layer of its
    own), and the schema still lists each of them."""
    async with app_client(make_settings()) as client:
        app = client.app  # type: ignore[attr-defined]
        schema = (await client.get("/openapi.json")).json()
        health_r = await client.get("/health_check")
    theirs = [*health.router.routes, *v2_routes.router.routes, *repository_routes.router.routes]
    assert all(any(mine is route for mine in app.router.routes) for route in theirs)
    assert all(hasattr(route, "path_regex") for route in app.router.routes)
    assert {r.path for r in theirs if r.include_in_schema} <= set(schema["paths"])
    assert health_r.status_code == 200
