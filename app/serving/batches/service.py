"""The Batch API's calls (docs/batches.md): a batch is created ``validating`` and left to
the replicas' runners (:mod:`.runner`); read, listed and cancelled by its tenant alone."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from app.errors import BadRequestError, BatchTokensLimitError, NotFoundError
from app.protocol.batches import BatchCreate
from app.serving.batches.files import Files
from app.serving.batches.lines import pins_of
from app.store.batches import BatchPage, BatchStore, new_batch_id
from app.store.db import now
from app.store.tables import BatchRow
from app.tenancy.registry import TenantRegistry
from app.tenancy.tenants import Principal


def not_found(batch_id: str) -> NotFoundError:
    """The answer for a batch the caller cannot read, whether unknown or another tenant's."""
    return NotFoundError(f"No batch found with id '{batch_id[:100]}'.", param="batch_id")


class Batches:
    def __init__(
        self,
        store: BatchStore,
        files: Files,
        window: timedelta,
        registry: Callable[[], TenantRegistry],
    ) -> None:
        self.store = store
        self.files = files
        self.window = window
        self.registry = registry

    async def create(self, principal: Principal, body: BatchCreate) -> BatchRow:
        """A new batch of the tenant's file ``input_file_id`` (its own, of purpose batch), each
        of the tenant's aliases resolved to the version its lines will run on."""
        tenant = principal.tenant
        source = await self.files.store.get(tenant.uid, body.input_file_id)
        if source is None:
            raise NotFoundError(f"No such File object: {body.input_file_id}", param="input_file_id")
        if source.purpose != "batch":
            raise BadRequestError(
                "The input file must have been uploaded with purpose batch.",
                param="input_file_id",
            )
        limit = await self.store.enqueued_limit(tenant.id)
        if limit is not None and await self.store.tokens_enqueued(tenant.uid) >= limit:
            raise BatchTokensLimitError(limit)
        created = now()
        row = BatchRow(
            id=new_batch_id(),
            tenant_uid=tenant.uid,
            tenant_id=tenant.id,
            key_id=principal.key_id,
            endpoint=body.endpoint,
            input_file_id=body.input_file_id,
            completion_window=body.completion_window,
            metadata_=body.metadata,
            status="validating",
            pins=pins_of(self.registry(), tenant),
            total=0,
            completed=0,
            failed=0,
            created_at=created,
            expires_at=created + self.window,
        )
        return await self.store.create(row)

    async def get(self, principal: Principal, batch_id: str) -> BatchRow:
        row = await self.store.get(principal.tenant.uid, batch_id)
        if row is None:
            raise not_found(batch_id)
        return row

    async def page(self, principal: Principal, *, after: str | None, limit: int) -> BatchPage:
        found = await self.store.page(principal.tenant.uid, after=after, limit=limit)
        if found is None:
            raise BadRequestError(f"No batch with id '{after}'.", param="after")
        return found

    async def cancel(self, principal: Principal, batch_id: str) -> BatchRow:
        """Ask the batch's runner to stop it: ``cancelling`` now, ``cancelled`` once its lines
        in flight are settled. A batch already finished, or finalizing (every line has run),
        is a 400 (cancelling one twice is not)."""
        return await self.cancel_of(principal.tenant.uid, batch_id)

    async def cancel_of(self, tenant_uid: str, batch_id: str) -> BatchRow:
        """:meth:`cancel` for the tenant ``tenant_uid`` (an operator's, in the console)."""
        row = await self.store.get(tenant_uid, batch_id)
        if row is None:
            raise not_found(batch_id)
        if row.status not in ("cancelling", "cancelled"):
            await self.store.move(batch_id, "cancelling", only_from=("validating", "in_progress"))
            # Read again: its runner may have moved it on meanwhile (to finalizing, say).
            row = await self.store.get(tenant_uid, batch_id)
            assert row is not None
        if row.status not in ("cancelling", "cancelled"):
            raise BadRequestError(
                f"Batch {batch_id} is {row.status}: it cannot be cancelled.", param="batch_id"
            )
        return row

    async def latest(self, tenant_uid: str, limit: int) -> list[BatchRow]:
        """The tenant's ``limit`` newest batches."""
        found = await self.store.page(tenant_uid, after=None, limit=limit)
        assert found is not None  # no cursor: always a page
        return found.batches


def unix(moment: Any) -> int | None:
    return None if moment is None else int(moment.timestamp())
