"""The Batch API's batches and their lines, per tenant, in the shared store: a batch's
progress is here, so any replica can take it over (under its lease, :mod:`app.store.leases`)
and resume it where it stopped. A tenant reads only its own: another tenant's id is not
found, exactly as an unknown one.

A line's result and its usage record are written in one transaction
(:meth:`BatchStore.finish_line`): a line is in the output exactly when it is billed, once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store import storage_usage
from app.store.changes import StoreVersion, polled
from app.store.db import lock_tenant, now
from app.store.tables import BatchLineRow, BatchRow, FileRow, QuotaRow

ACTIVE_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
ACTIVE_IDS = (
    select(BatchRow.id).where(BatchRow.status.in_(ACTIVE_STATUSES)).order_by(BatchRow.created_at)
)
LineStatus = Literal["pending", "ok", "error", "expired", "cancelled"]
INSERT_CHUNK = 500
"""Lines one write records, or one read takes."""


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class BatchPage:
    batches: list[BatchRow]
    has_more: bool


class EnqueuedLimitPassed(Exception):
    """A batch's lines, with the tenant's other batches' unrun lines, would pass its
    ``batch_tokens_enqueued`` quota."""

    def __init__(self, enqueued: int, limit: int) -> None:
        super().__init__(f"{enqueued} tokens enqueued, the limit is {limit}")
        self.enqueued = enqueued
        self.limit = limit


@dataclass(frozen=True)
class PendingLine:
    line: int
    custom_id: str
    body: dict[str, Any]
    cost: int = 0


class BatchStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @property
    def sessions(self) -> async_sessionmaker[AsyncSession]:
        return self._sessions

    async def create(self, row: BatchRow) -> BatchRow:
        async with self._sessions.begin() as session:
            session.add(row)
        return row

    async def get(self, tenant_uid: str, batch_id: str) -> BatchRow | None:
        query = select(BatchRow).where(BatchRow.id == batch_id, BatchRow.tenant_uid == tenant_uid)
        async with self._sessions() as session:
            return (await session.execute(query)).scalar_one_or_none()

    async def by_id(self, batch_id: str) -> BatchRow | None:
        async with self._sessions() as session:
            return await session.get(BatchRow, batch_id)

    async def page(self, tenant_uid: str, *, after: str | None, limit: int) -> BatchPage | None:
        """The tenant's batches newest first, at most ``limit`` after the batch ``after``;
        None where ``after`` is not one of its batches."""
        query = select(BatchRow).where(BatchRow.tenant_uid == tenant_uid)
        if after is not None:
            cursor = await self.get(tenant_uid, after)
            if cursor is None:
                return None
            at = cursor.created_at
            query = query.where(
                or_(BatchRow.created_at < at, and_(BatchRow.created_at == at, BatchRow.id < after))
            )
        query = query.order_by(BatchRow.created_at.desc(), BatchRow.id.desc()).limit(limit + 1)
        async with self._sessions() as session:
            rows = list((await session.scalars(query)).all())
        return BatchPage(batches=rows[:limit], has_more=len(rows) > limit)

    async def active_ids(self, version: StoreVersion | None = None) -> list[str]:
        """Every batch that is not finished yet, oldest first, for a poll
        (:func:`app.store.changes.polled`)."""
        return await polled(self._sessions, version, ACTIVE_IDS)

    async def move(
        self,
        batch_id: str,
        status: str,
        *,
        only_from: Sequence[str],
        files: Sequence[FileRow] = (),
        **values: Any,
    ) -> bool:
        """Set the batch's ``status`` (and its time, ``<status>_at``, and ``values``) where it
        is in one of ``only_from``, and record ``files`` (its results, named by ``values``)
        in the same transaction (counted in their tenants' stored bytes): none is recorded unless
        it moved. Whether it moved."""
        query = (
            update(BatchRow)
            .where(BatchRow.id == batch_id, BatchRow.status.in_(only_from))
            .values(status=status, **{f"{status}_at": now()}, **values)
        )
        async with self._sessions.begin() as session:
            if not (await session.execute(query)).rowcount:  # type: ignore[attr-defined]
                return False
            session.add_all(files)
            counted = storage_usage.tally((file.tenant_uid, file.bytes) for file in files)
            await storage_usage.add(session, counted)
        return True

    async def clear_lines(self, batch_id: str) -> None:
        """Forget the batch's lines (a validation that starts again, or failed)."""
        async with self._sessions.begin() as session:
            await session.execute(delete(BatchLineRow).where(BatchLineRow.batch_id == batch_id))

    async def add_lines(self, batch_id: str, lines: Sequence[PendingLine]) -> None:
        """Record validated lines, pending (the batch runs none before :meth:`start`)."""
        rows = [
            {
                "batch_id": batch_id,
                "line": line.line,
                "custom_id": line.custom_id,
                "body": line.body,
                "cost": line.cost,
                "status": "pending",
                "output": None,
            }
            for line in lines
        ]
        if rows:
            async with self._sessions.begin() as session:
                await session.execute(insert(BatchLineRow), rows)

    async def start(
        self, batch_id: str, total: int, pins: dict[str, Any], *, cost: int = 0
    ) -> bool:
        """Move the batch, its ``total`` lines recorded, to ``in_progress``; whether it was
        still validating. Its lines' worst-case ``cost``, with the tenant's other batches'
        unrun lines, must be within its ``batch_tokens_enqueued`` quota, else
        :class:`EnqueuedLimitPassed` and it stays validating. Exact: counted and started in
        one transaction under the tenant's lock, so batches started at once never pass the
        quota together."""
        async with self._sessions.begin() as session:
            batch = await session.get(BatchRow, batch_id)
            if batch is None or batch.status != "validating":
                return False
            await lock_tenant(session, batch.tenant_uid)
            limit = await self._enqueued_limit(session, batch.tenant_id)
            if limit is not None:
                enqueued = await self._tokens_enqueued(session, batch.tenant_uid)
                if enqueued + cost > limit:
                    raise EnqueuedLimitPassed(enqueued, limit)
            started = (
                update(BatchRow)
                .where(BatchRow.id == batch_id, BatchRow.status == "validating")
                .values(status="in_progress", in_progress_at=now(), pins=pins, total=total)
            )
            return bool((await session.execute(started)).rowcount)  # type: ignore[attr-defined]

    async def pending(
        self, batch_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[PendingLine]:
        """The batch's pending lines after line ``after``, in order, at most ``limit``."""
        query = (
            select(BatchLineRow.line, BatchLineRow.custom_id, BatchLineRow.body, BatchLineRow.cost)
            .where(
                BatchLineRow.batch_id == batch_id,
                BatchLineRow.status == "pending",
                BatchLineRow.line > after,
            )
            .order_by(BatchLineRow.line)
            .limit(limit)
        )
        async with self._sessions() as session:
            return [PendingLine(*row) for row in (await session.execute(query)).all()]

    async def finish_line(
        self,
        batch_id: str,
        line: int,
        status: LineStatus,
        output: dict[str, Any],
        *,
        also: Any = None,
    ) -> bool:
        """Record a pending line's result, count it in the batch's progress, and run
        ``also(session)`` (the line's usage record) in the same transaction; whether the line
        was still pending (it is never finished twice)."""
        finished = (
            update(BatchLineRow)
            .where(
                BatchLineRow.batch_id == batch_id,
                BatchLineRow.line == line,
                BatchLineRow.status == "pending",
            )
            .values(status=status, output=output)
        )
        counter = BatchRow.completed if status == "ok" else BatchRow.failed
        async with self._sessions.begin() as session:
            if not (await session.execute(finished)).rowcount:  # type: ignore[attr-defined]
                return False
            await session.execute(
                update(BatchRow).where(BatchRow.id == batch_id).values({counter: counter + 1})
            )
            if also is not None:
                await also(session)
        return True

    async def settle_unrun(
        self,
        batch_id: str,
        status: LineStatus,
        output: Callable[[PendingLine], dict[str, Any]],
    ) -> int:
        """Mark every pending line ``status`` with ``output(line)``; how many."""
        settled = after = 0
        while page := await self.pending(batch_id, after=after, limit=INSERT_CHUNK):
            for line in page:
                settled += await self.finish_line(batch_id, line.line, status, output(line))
            after = page[-1].line
        return settled

    async def outputs(
        self, batch_id: str, statuses: Sequence[str], *, after: int = 0, limit: int = INSERT_CHUNK
    ) -> list[tuple[int, dict[str, Any]]]:
        """The finished lines of ``statuses`` after line ``after``, at most ``limit``, in
        input order: each line's number and the line as its file has it."""
        query = (
            select(BatchLineRow.line, BatchLineRow.output)
            .where(
                BatchLineRow.batch_id == batch_id,
                BatchLineRow.status.in_(statuses),
                BatchLineRow.line > after,
                BatchLineRow.output.is_not(None),
            )
            .order_by(BatchLineRow.line)
            .limit(limit)
        )
        async with self._sessions() as session:
            return [(line, output) for line, output in (await session.execute(query)).all()]

    async def tokens_enqueued(self, tenant_uid: str) -> int:
        """The worst-case tokens of the tenant's lines still to run."""
        async with self._sessions() as session:
            return await self._tokens_enqueued(session, tenant_uid)

    async def enqueued_limit(self, tenant_id: str) -> int | None:
        """The tenant's ``batch_tokens_enqueued`` quota; None where it has none."""
        async with self._sessions() as session:
            return await self._enqueued_limit(session, tenant_id)

    @staticmethod
    async def _tokens_enqueued(session: AsyncSession, tenant_uid: str) -> int:
        query = (
            select(func.coalesce(func.sum(BatchLineRow.cost), 0))
            .join(BatchRow, BatchRow.id == BatchLineRow.batch_id)
            .where(
                BatchRow.tenant_uid == tenant_uid,
                BatchRow.status.in_(("in_progress", "cancelling")),
                BatchLineRow.status == "pending",
            )
        )
        return int((await session.execute(query)).scalar_one())

    @staticmethod
    async def _enqueued_limit(session: AsyncSession, tenant_id: str) -> int | None:
        query = select(QuotaRow.batch_tokens_enqueued).where(QuotaRow.tenant_id == tenant_id)
        return (await session.execute(query)).scalar_one_or_none()
