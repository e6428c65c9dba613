"""Request and response bodies, for validation messages and the OpenAPI document."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class PredictRequest(BaseModel):
    instances: list[Any] = Field(
        ...,
        min_length=1,
        description="one item per instance: a string for text models, a nested list of numbers "
        "of the model's per-item shape for tensor models",
    )


class PredictResponse(BaseModel):
    predictions: list[Any]


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelHealth(BaseModel):
    model: str
    version: str
    status: str = Field(..., description="ready, busy, loading, unloading, unavailable, "
                                         "unhealthy or draining")
    queue_depth: int
    queue_capacity: int


class HealthResponse(BaseModel):
    status: str = Field(..., description="ready, busy, loading, draining or unhealthy")
    queue_depth: int = Field(..., description="items waiting, every model together")
    queue_capacity: int
    models: list[ModelHealth] | None = Field(None, description="each model (not with ?model=)")
    model: str | None = Field(None, description="with ?model=: the model answered for")
    version: str | None = None
