"""Read-only listings for the admin API and console: searched, filtered and paginated in the
store, so that a page stays fast with 10,000 tenants or 1,000 adapters."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

from sqlalchemy import Select, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.tables import AdapterVersionRow, AuditRow, TenantRow

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    total: int
    offset: int
    limit: int | None
    """``None``: every item from ``offset`` on."""

    @property
    def next_offset(self) -> int | None:
        end = self.offset + len(self.items)
        return end if end < self.total else None

    @property
    def previous_offset(self) -> int | None:
        return max(0, self.offset - (self.limit or 0)) if self.offset > 0 else None


@dataclass(frozen=True)
class AuditFilter:
    actor: str | None = None
    action: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class AdapterSummary:
    name: str
    versions: list[AdapterVersionRow] = field(default_factory=list)

    @property
    def latest(self) -> AdapterVersionRow:
        return self.versions[-1]


def _containing(text: str) -> str:
    """A LIKE pattern for ``text`` anywhere, its own wildcards taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def _page(
    sessions: async_sessionmaker[AsyncSession], query: Select[T], offset: int, limit: int | None
) -> Page[T]:
    async with sessions() as session:
        total = await session.scalar(select(func.count()).select_from(query.subquery()))
        items = list(await session.scalars(query.offset(offset).limit(limit)))
    return Page(items, int(total or 0), offset, limit)


async def tenants_page(
    sessions: async_sessionmaker[AsyncSession],
    *,
    search: str = "",
    offset: int = 0,
    limit: int | None = 50,
) -> Page[TenantRow]:
    """Tenants by id, those whose id or name contains ``search`` (any case)."""
    query = select(TenantRow).order_by(TenantRow.id)
    if search:
        pattern = _containing(search.lower())
        query = query.where(
            or_(
                func.lower(TenantRow.id).like(pattern, escape="\\"),
                func.lower(TenantRow.name).like(pattern, escape="\\"),
            )
        )
    return await _page(sessions, query, offset, limit)


async def adapters_page(
    sessions: async_sessionmaker[AsyncSession],
    *,
    search: str = "",
    offset: int = 0,
    limit: int | None = 50,
) -> Page[AdapterSummary]:
    """Adapters by name with all their versions, those whose name contains ``search``."""
    names = select(AdapterVersionRow.name).distinct().order_by(AdapterVersionRow.name)
    if search:
        names = names.where(
            func.lower(AdapterVersionRow.name).like(_containing(search.lower()), escape="\\")
        )
    page = await _page(sessions, names, offset, limit)
    versions = select(AdapterVersionRow).where(AdapterVersionRow.name.in_(page.items))
    async with sessions() as session:
        rows = await session.scalars(versions.order_by(AdapterVersionRow.version))
    by_name: dict[str, AdapterSummary] = {name: AdapterSummary(name) for name in page.items}
    for row in rows:
        by_name[row.name].versions.append(row)
    return Page(list(by_name.values()), page.total, offset, limit)


async def audit_page(
    sessions: async_sessionmaker[AsyncSession],
    where: AuditFilter,
    *,
    offset: int = 0,
    limit: int = 100,
) -> Page[AuditRow]:
    """Audit records, newest first, by exact actor and action, from ``since`` (inclusive)
    to ``until`` (exclusive)."""
    query = select(AuditRow).order_by(AuditRow.id.desc())
    if where.actor:
        query = query.where(AuditRow.actor == where.actor)
    if where.action:
        query = query.where(AuditRow.action == where.action)
    if where.since is not None:
        query = query.where(AuditRow.at >= where.since)
    if where.until is not None:
        query = query.where(AuditRow.at < where.until)
    return await _page(sessions, query, offset, limit)
