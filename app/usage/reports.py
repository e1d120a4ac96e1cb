"""Reports over the usage ledger: totals per tenant, and totals per time bucket.

Shadow runs are in the ledger (the version comparison reads them) but are never a tenant's
usage: every report here leaves them out.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy import BigInteger, ColumnElement, Integer, String, cast, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.tables import UsageRow

GroupBy = Literal["adapter", "key", "day"]
BucketGroup = Literal["model", "api_key_id", "batch"]
"""What a bucket's totals may be split by: the model the tenant named (an alias or the base
model), the API key, and whether the requests were batch lines."""
_GROUP_COLUMNS: dict[BucketGroup, ColumnElement[Any]] = {
    "model": UsageRow.model,  # type: ignore[dict-item]
    "api_key_id": UsageRow.key_id,  # type: ignore[dict-item]
    "batch": UsageRow.batch_id.is_not(None),
}


@dataclass(frozen=True)
class UsageTotal:
    group: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class BucketTotal:
    """One bucket's totals for one group (``model`` and ``key_id`` are ``None`` unless the
    report is split by them)."""

    start: int
    """The bucket's start, in Unix seconds."""
    model: str | None
    key_id: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    batch: bool | None = None
    """Whether they were batch lines, where the report is split by it."""


def _totals() -> list[ColumnElement[int]]:
    return [
        func.count(UsageRow.id),
        func.coalesce(func.sum(UsageRow.prompt_tokens), 0),
        func.coalesce(func.sum(UsageRow.completion_tokens), 0),
    ]


async def usage_totals(
    sessions: async_sessionmaker[AsyncSession],
    tenant_uid: str,
    *,
    start: datetime | None,
    end: datetime | None,
    group_by: GroupBy | None,
) -> list[UsageTotal]:
    """Totals of the requests of the tenant ``tenant_uid`` started in ``[start, end)``,
    optionally grouped by adapter (the alias the tenant called), key or UTC day."""
    column = {
        "adapter": UsageRow.model,
        "key": UsageRow.key_id,
        "day": _utc_day(sessions),
        None: None,
    }[group_by]
    query = select(*_totals(), *([column] if column is not None else [])).where(
        UsageRow.tenant_uid == tenant_uid, UsageRow.shadow.is_(False)
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


async def usage_by_bucket(
    sessions: async_sessionmaker[AsyncSession],
    tenant_uid: str | None,
    *,
    start: int,
    end: int,
    width: int,
    group_by: Collection[BucketGroup] = (),
    models: Collection[str] = (),
    key_ids: Collection[str] = (),
    batch: bool | None = None,
) -> list[BucketTotal]:
    """Totals of the requests started in ``[start, end)`` (Unix seconds) in buckets of
    ``width`` seconds from ``start``, of the tenant ``tenant_uid`` (``None``: of every tenant),
    optionally only of ``models`` and ``key_ids``, only batch lines (``batch`` True) or only
    online requests (False), and split by ``group_by``. Buckets without
    requests are left out; the rest come in time order, then by group."""
    if width < 1 or end < start:
        raise ValueError(f"no buckets of {width} s in [{start}, {end})")
    # Integer division (SQLAlchemy's `//`): the bucket of each request, from 0.
    index = (_epoch_seconds(sessions) - start) // width
    dimensions = [name for name in _GROUP_COLUMNS if name in group_by]
    grouped = [_GROUP_COLUMNS[name] for name in dimensions]
    query = select(index, *grouped, *_totals()).where(
        UsageRow.shadow.is_(False),
        UsageRow.started_at >= _moment(start),
        UsageRow.started_at < _moment(end),
    )
    if tenant_uid is not None:
        query = query.where(UsageRow.tenant_uid == tenant_uid)
    if models:
        query = query.where(UsageRow.model.in_(models))
    if key_ids:
        query = query.where(UsageRow.key_id.in_(key_ids))
    if batch is not None:
        query = query.where(
            UsageRow.batch_id.is_not(None) if batch else UsageRow.batch_id.is_(None)
        )
    query = query.group_by(index, *grouped).order_by(index, *grouped)
    async with sessions() as session:
        rows = (await session.execute(query)).all()
    totals = []
    for bucket, *values in rows:
        groups = dict(zip(dimensions, values[: len(dimensions)], strict=False))
        requests, prompt, completion = values[len(dimensions) :]
        totals.append(
            BucketTotal(
                start=start + int(bucket) * width,
                model=groups.get("model"),
                key_id=groups.get("api_key_id"),
                batch=None if "batch" not in groups else bool(groups["batch"]),
                requests=int(requests),
                prompt_tokens=int(prompt),
                completion_tokens=int(completion),
            )
        )
    return totals


def _moment(unix_seconds: int) -> datetime:
    return datetime.fromtimestamp(unix_seconds, tz=timezone.utc)


def _epoch_seconds(sessions: async_sessionmaker[AsyncSession]) -> ColumnElement[int]:
    """The start time in whole Unix seconds, as each backend computes it."""
    if sessions.kw["bind"].dialect.name == "postgresql":
        return cast(func.floor(func.extract("epoch", UsageRow.started_at)), BigInteger)
    return cast(func.strftime("%s", UsageRow.started_at), Integer)


def _utc_day(sessions: async_sessionmaker[AsyncSession]) -> ColumnElement[str]:
    """``YYYY-MM-DD`` of the UTC start time, as each backend spells it."""
    if sessions.kw["bind"].dialect.name == "postgresql":
        utc = func.timezone("UTC", UsageRow.started_at)
        return func.to_char(utc, "YYYY-MM-DD", type_=String)
    return func.strftime("%Y-%m-%d", UsageRow.started_at, type_=String)


async def top_tenants(
    sessions: async_sessionmaker[AsyncSession], *, start: int, end: int, limit: int = 10
) -> list[UsageTotal]:
    """The tenants that used the most tokens from ``start`` to ``end`` (Unix seconds), as
    ``UsageTotal`` grouped by tenant id, most first."""
    tokens = func.sum(UsageRow.prompt_tokens + UsageRow.completion_tokens)
    query = (
        select(UsageRow.tenant_id, *_totals())
        .where(
            UsageRow.shadow.is_(False),
            UsageRow.started_at >= _moment(start),
            UsageRow.started_at < _moment(end),
        )
        .group_by(UsageRow.tenant_id)
        .order_by(tokens.desc(), UsageRow.tenant_id)
        .limit(limit)
    )
    async with sessions() as session:
        rows = (await session.execute(query)).all()
    return [UsageTotal(str(row[0]), int(row[1]), int(row[2]), int(row[3])) for row in rows]
