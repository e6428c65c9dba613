"""``/docs`` in a real headless browser (Debian's chromium) on a machine without internet: its
scripts and styles come from the server, so the page shows the operations."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import httpx
import pytest

from tests.conftest import WAIT_S, serve, wait_ready

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# No network for the browser beyond the server: whatever it would fetch elsewhere fails.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=127.0.0.1",
         "--virtual-time-budget=10000", "--dump-dom"]


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (.ci/run installs it)")
def test_the_docs_page_shows_the_operations_without_internet() -> None:
    with serve("--model", "linear", "--devices", "cpu") as (_, url), \
            tempfile.TemporaryDirectory() as profile:
        wait_ready(url)
        page = httpx.get(url + "/docs", timeout=10).text
        assert "cdn" not in page.lower() and "/docs/assets/swagger-ui-bundle.js" in page
        dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", url + "/docs"],
                             capture_output=True, text=True, timeout=WAIT_S).stdout
    # Swagger UI rendered the schema: the operations and their summaries are in the page.
    for text in ("/predict", "Run the model on a list of instances", "/health_check",
                 "/v2/models/{name}/infer"):
        assert text in dom, text
