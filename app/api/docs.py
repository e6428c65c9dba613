"""``/docs`` (Swagger UI) and ``/redoc``, their scripts and styles served from the fastapi-offline
package rather than a CDN: the pages work on a machine without internet."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

ASSETS = "/docs/assets"


def add_docs(app: FastAPI) -> None:
    app.mount(ASSETS, StaticFiles(directory=offline_assets()), name="docs-assets")
    _page(app, "/docs", lambda schema, assets: get_swagger_ui_html(
        openapi_url=schema, title=f"{app.title} - Swagger UI",
        swagger_js_url=f"{assets}/swagger-ui-bundle.js",
        swagger_css_url=f"{assets}/swagger-ui.css", swagger_favicon_url=f"{assets}/favicon.png"))
    _page(app, "/redoc", lambda schema, assets: get_redoc_html(
        openapi_url=schema, title=f"{app.title} - ReDoc",
        redoc_js_url=f"{assets}/redoc.standalone.js", redoc_favicon_url=f"{assets}/favicon.png",
        with_google_fonts=False))


def _page(app: FastAPI, path: str, render: Callable[[str, str], HTMLResponse]) -> None:
    """A page at ``path``: ``render(schema URL, assets URL)``, both under the app's root path."""
    async def page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return render(f"{root}{app.openapi_url}", f"{root}{ASSETS}")

    app.add_api_route(path, page, methods=["GET", "HEAD"], include_in_schema=False)


def offline_assets() -> str:
    import fastapi_offline

    return str(Path(fastapi_offline.__file__).parent / "static")
