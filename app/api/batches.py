"""OpenAI's Batch API under ``/v1/batches`` (docs/batches.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import CurrentPrincipal, GatewayDep
from app.api.openai import ERROR_RESPONSES
from app.protocol.batches import Batch, BatchCreate, BatchErrors, BatchList, RequestCounts
from app.serving.batches.service import unix
from app.store.tables import BatchRow

router = APIRouter(prefix="/v1", tags=["openai: batches"])


def batch_object(row: BatchRow) -> Batch:
    return Batch(
        id=row.id,
        endpoint=row.endpoint,
        errors=BatchErrors.model_validate(row.errors) if row.errors else None,
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        status=row.status,
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        created_at=int(row.created_at.timestamp()),
        in_progress_at=unix(row.in_progress_at),
        expires_at=unix(row.expires_at),
        finalizing_at=unix(row.finalizing_at),
        completed_at=unix(row.completed_at),
        failed_at=unix(row.failed_at),
        expired_at=unix(row.expired_at),
        cancelling_at=unix(row.cancelling_at),
        cancelled_at=unix(row.cancelled_at),
        request_counts=RequestCounts(total=row.total, completed=row.completed, failed=row.failed),
        metadata=row.metadata_,
    )


@router.post("/batches", response_model=Batch, responses=ERROR_RESPONSES)
async def create_batch(
    body: BatchCreate, gateway: GatewayDep, principal: CurrentPrincipal
) -> Batch:
    """A batch of the requests in an uploaded file; it is ``validating`` until a replica
    has checked every line."""
    return batch_object(await gateway.batches.create(principal, body))


@router.get("/batches", response_model=BatchList, responses=ERROR_RESPONSES)
async def list_batches(
    gateway: GatewayDep,
    principal: CurrentPrincipal,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    found = await gateway.batches.page(principal, after=after, limit=limit)
    return BatchList(data=[batch_object(row) for row in found.batches], has_more=found.has_more)


@router.get("/batches/{batch_id}", response_model=Batch, responses=ERROR_RESPONSES)
async def retrieve_batch(batch_id: str, gateway: GatewayDep, principal: CurrentPrincipal) -> Batch:
    return batch_object(await gateway.batches.get(principal, batch_id))


@router.post("/batches/{batch_id}/cancel", response_model=Batch, responses=ERROR_RESPONSES)
async def cancel_batch(batch_id: str, gateway: GatewayDep, principal: CurrentPrincipal) -> Batch:
    """Stop the batch: ``cancelling`` until its lines in flight are settled, then
    ``cancelled`` with what it finished in its files."""
    return batch_object(await gateway.batches.cancel(principal, batch_id))
