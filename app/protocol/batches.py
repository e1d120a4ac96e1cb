"""OpenAI's Batch API objects (docs/batches.md): what ``client.batches.*`` sends and reads."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.protocol.common import ObjectList

BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
Metadata = dict[
    Annotated[str, StringConstraints(max_length=64)],
    Annotated[str, StringConstraints(max_length=512)],
]
METADATA_PAIRS = 16


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=64)
    endpoint: BatchEndpoint
    completion_window: Literal["24h"]
    metadata: Metadata | None = Field(None, max_length=METADATA_PAIRS)


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: Metadata | None = None


class BatchList(ObjectList[Batch]):
    pass
