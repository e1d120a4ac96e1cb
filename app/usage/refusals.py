"""Quota refusals per tenant, minute and limit, kept in memory and added to the store's
counts with each ledger write, so that the console's charts hold every replica's.

A refused request writes nothing of its own (a tenant flooding refusals must not flood the
store): it adds one to a counter, and each write adds the counters up, one row per tenant,
minute and limit.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

from sqlalchemy import Connection, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.tables import RefusalRow

RefusalKey = tuple[str, str, int, str]
"""(tenant uid, tenant id, the minute in Unix seconds, limit)."""

MAX_KEYS = 100_000
"""Counters kept while the store cannot be written; past that the oldest minutes go."""


class RefusalCounts:
    def __init__(self) -> None:
        self._counts: Counter[RefusalKey] = Counter()

    def __len__(self) -> int:
        return len(self._counts)

    def count(self, tenant_uid: str, tenant_id: str, limit: str, at: float) -> None:
        self._counts[tenant_uid, tenant_id, int(at) // 60 * 60, limit] += 1

    def take(self) -> Counter[RefusalKey]:
        taken, self._counts = self._counts, Counter()
        return taken

    def put_back(self, counts: Counter[RefusalKey]) -> None:
        """What a write could not store, counted again (with what came since)."""
        self._counts.update(counts)
        if len(self._counts) > MAX_KEYS:
            for key in sorted(self._counts, key=lambda k: k[2])[: len(self._counts) - MAX_KEYS]:
                del self._counts[key]


async def add_refusals(session: AsyncSession, counts: Counter[RefusalKey]) -> None:
    """Add ``counts`` to the stored ones, in ``session``'s transaction."""
    rows = [
        {
            "tenant_uid": uid,
            "tenant_id": tenant_id,
            "minute": datetime.fromtimestamp(minute, tz=timezone.utc),
            "limit": limit,
            "count": n,
        }
        for (uid, tenant_id, minute, limit), n in sorted(counts.items())
    ]
    await session.run_sync(lambda sync: _upsert(sync.connection(), rows))


def _upsert(connection: Connection, rows: list[dict[str, object]]) -> None:
    # Both dialects spell it ON CONFLICT ... DO UPDATE: concurrent replicas add, never lose.
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(RefusalRow)
    statement = statement.on_conflict_do_update(
        index_elements=["tenant_uid", "minute", "limit"],
        set_={"count": RefusalRow.count + statement.excluded.count},
    )
    connection.execute(statement, rows)


async def refusals_by_bucket(
    sessions: async_sessionmaker[AsyncSession],
    *,
    start: int,
    end: int,
    width: int,
    tenant_uid: str | None = None,
) -> dict[int, int]:
    """Refusals per bucket of ``width`` seconds from ``start`` to ``end`` (Unix seconds),
    of one tenant or all; buckets without refusals are left out."""
    per_minute = func.sum(RefusalRow.count)
    query = select(RefusalRow.minute, per_minute).where(
        RefusalRow.minute >= datetime.fromtimestamp(start, tz=timezone.utc),
        RefusalRow.minute < datetime.fromtimestamp(end, tz=timezone.utc),
    )
    if tenant_uid is not None:
        query = query.where(RefusalRow.tenant_uid == tenant_uid)
    totals: Counter[int] = Counter()
    async with sessions() as session:
        for minute, count in await session.execute(query.group_by(RefusalRow.minute)):
            totals[start + (int(minute.timestamp()) - start) // width * width] += int(count)
    return dict(totals)
