"""schemathesis against the server's own OpenAPI schema, with inputs that fit the schema and
inputs that break it: no server error (a 5xx the route does not document), no hang, and no
traceback or internal path in any error body; in one process and through two front ends,
whose app and proxies to the device process answer every route there."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode

from tests.conftest import live_server, make_settings, split_server

pytestmark = pytest.mark.slow

LEAKS = ("Traceback", 'File "', "site-packages", "/app/", ".py")


@pytest.fixture(scope="module", params=["one process", "two front ends"])
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The server's URL."""
    if request.param == "one process":
        with live_server(make_settings(max_instances=8, max_body_bytes=64 * 1024)) as srv:
            yield srv.url
    else:
        with split_server("--model", "linear", "--frontends", "2", "--max-instances", "8",
                          "--max-body-bytes", str(64 * 1024)) as (_, url):
            yield url


@pytest.fixture(scope="module")
def operations(server: str) -> dict[str, Any]:
    schema = schemathesis.openapi.from_url(server + "/openapi.json")
    ops = [result.ok() for result in schema.get_all_operations()]
    return {f"{op.method.upper()} {op.path}": op for op in ops}


def test_the_schema_lists_every_route(operations: dict[str, Any]) -> None:
    assert {"POST /predict", "GET /health_check", "GET /metrics",
            "POST /v2/models/{name}/infer"} <= set(operations)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_error_and_no_hang(
    operations: dict[str, Any], server: str, mode: GenerationMode
) -> None:
    exercised = []
    for label, operation in sorted(operations.items()):

        # The model's own name, so that infer requests reach the parser and the model.
        names = {"name": "linear"} if "{name}" in operation.path else None
        strategy = operation.as_strategy(generation_mode=mode, path_parameters=names)
        # A 503 or 504 is an answer where the route documents it: a short X-Request-Timeout
        # is refused at arrival (503 deadline) or times out (504). A 500 never is.
        answers = {int(code) for code in operation.definition.raw["responses"]
                   if code.isdigit() and code != "500"}

        @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        @given(case=strategy)
        def check(case: Any) -> None:
            response = case.call(base_url=server, timeout=30)  # a hang fails here
            status = response.status_code
            ok = status < 500 or status in answers  # noqa: B023 (check() runs in this pass)
            assert ok, (case.path, status, response.text[:300])
            if response.status_code >= 400:
                assert not any(leak in response.text for leak in LEAKS), response.text[:300]

        try:
            check()
        except Unsatisfiable:
            # Nothing in a route without parameters or body can break its schema.
            assert mode is GenerationMode.NEGATIVE, label
            continue
        exercised.append(label)
    assert {"POST /predict", "POST /v2/models/{name}/infer"} <= set(exercised)
