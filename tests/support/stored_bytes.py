"""Each tenant's stored bytes two ways: the running totals the writes keep
(:mod:`app.store.storage_usage`), and a fresh sum of the files' and stored responses' rows,
which the totals must always equal."""

from __future__ import annotations

from sqlalchemy import func, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.tables import FileRow, StorageUsageRow, StoredResponseRow


async def summed(sessions: async_sessionmaker[AsyncSession]) -> dict[str, int]:
    """Tenant uid -> the sizes of its files and stored responses, summed afresh."""
    rows = union_all(
        select(FileRow.tenant_uid, FileRow.bytes.label("size")),
        select(StoredResponseRow.tenant_uid, StoredResponseRow.size_bytes.label("size")),
    ).subquery()
    query = select(rows.c.tenant_uid, func.sum(rows.c.size)).group_by(rows.c.tenant_uid)
    async with sessions() as session:
        return {uid: int(size) for uid, size in (await session.execute(query)).all()}


async def totals(sessions: async_sessionmaker[AsyncSession]) -> dict[str, int]:
    """Tenant uid -> its running total, where it holds anything."""
    query = select(StorageUsageRow.tenant_uid, StorageUsageRow.bytes)
    async with sessions() as session:
        return {uid: size for uid, size in (await session.execute(query)).all() if size}
