"""The usage ledger: one record per request, written in batches off the hot path."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import ColumnElement, String, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.tables import UsageRow

logger = logging.getLogger(__name__)

GroupBy = Literal["adapter", "key", "day"]
FLUSH_SECONDS = 1.0


@dataclass(frozen=True)
class UsageRecord:
    request_id: str
    tenant_id: str
    key_id: str
    endpoint: str
    model: str
    adapter: str | None
    adapter_version: int | None
    prompt_tokens: int
    completion_tokens: int
    status: Literal["ok", "cancelled", "error"]
    latency_ms: int
    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True)
class UsageTotal:
    group: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int


class UsageLedger:
    """``record`` only appends to memory; ``run`` writes what accumulated every
    second, one transaction per batch. A failed batch is kept and retried."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._pending: list[UsageRecord] = []

    def record(self, record: UsageRecord) -> None:
        self._pending.append(record)

    async def flush(self) -> int:
        batch, self._pending = self._pending, []
        if not batch:
            return 0
        try:
            async with self._sessions.begin() as session:
                session.add_all(UsageRow(**asdict(r)) for r in batch)
        except Exception:
            self._pending[:0] = batch
            raise
        return len(batch)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            try:
                await self.flush()
            except Exception:
                logger.exception("could not write %d usage records; will retry", len(self._pending))


async def usage_totals(
    sessions: async_sessionmaker[AsyncSession],
    tenant_id: str,
    *,
    start: datetime | None,
    end: datetime | None,
    group_by: GroupBy | None,
) -> list[UsageTotal]:
    """Totals of the tenant's requests started in ``[start, end)``, optionally grouped
    by adapter (the alias the tenant called), key or UTC day."""
    column = {
        "adapter": UsageRow.model,
        "key": UsageRow.key_id,
        "day": _utc_day(sessions),
        None: None,
    }[group_by]
    selected = [
        func.count(UsageRow.id),
        func.coalesce(func.sum(UsageRow.prompt_tokens), 0),
        func.coalesce(func.sum(UsageRow.completion_tokens), 0),
    ]
    query = select(*selected, *([column] if column is not None else [])).where(
        UsageRow.tenant_id == tenant_id
    )
    if start is not None:
        query = query.where(UsageRow.started_at >= start)
    if end is not None:
        query = query.where(UsageRow.started_at < end)
    if column is not None:
        query = query.group_by(column).order_by(column)
    async with sessions() as session:
        rows = (await session.execute(query)).all()
    return [
        UsageTotal(
            group=str(row[3]) if column is not None else None,
            requests=int(row[0]),
            prompt_tokens=int(row[1]),
            completion_tokens=int(row[2]),
        )
        for row in rows
    ]


def _utc_day(sessions: async_sessionmaker[AsyncSession]) -> ColumnElement[str]:
    """``YYYY-MM-DD`` of the UTC start time, as each backend spells it."""
    bind = sessions.kw["bind"]
    if bind.dialect.name == "postgresql":
        utc = func.timezone("UTC", UsageRow.started_at)
        return func.to_char(utc, "YYYY-MM-DD", type_=String)
    return func.strftime("%Y-%m-%d", UsageRow.started_at, type_=String)
