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


class HealthResponse(BaseModel):
    status: str = Field(..., description="ready, busy, loading, draining or unhealthy")
    queue_depth: int
    queue_capacity: int
