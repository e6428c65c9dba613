"""``Annotated`` aliases that read the per-app objects from ``app.state``.

They are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in a thread pool, which
costs thread hops per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.runtime import InferenceService


async def _service(request: Request) -> InferenceService:
    service: InferenceService = request.app.state.service
    return service


ServiceDep = Annotated[InferenceService, Depends(_service)]


async def _counted(request: Request) -> InferenceService:
    """The service once every front end has sent the request counts it holds (app/bridge.py):
    what /metrics and the statistics read count every request answered before them."""
    service = await _service(request)
    for gather in service.before_scrape:
        await gather()
    return service


CountedServiceDep = Annotated[InferenceService, Depends(_counted)]
