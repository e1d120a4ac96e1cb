"""Each tenant's stored bytes as a running total (:class:`StorageUsageRow`): every write that
adds, resizes or deletes a file's or a stored response's row adds its change to the total of
the row's tenant, in the same transaction, so the total is always the sum of the rows and the
storage cap reads one row instead of summing them.

The change is an upsert that adds to the row where it is (the row is locked, so changes at
once add up on PostgreSQL as on SQLite). A transaction that changes several tenants' totals
changes them in the order of their uids, as every such transaction does, so that two of them
on PostgreSQL never wait on each other's rows in a cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, Insert, Table, bindparam, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import ReturningDelete

from app.store.tables import StorageUsageRow

USAGE = StorageUsageRow.__table__


def tally(changes: Iterable[tuple[str, int]]) -> dict[str, int]:
    """(tenant uid, bytes) pairs summed per tenant."""
    totals: dict[str, int] = defaultdict(int)
    for tenant_uid, size in changes:
        totals[tenant_uid] += size
    return dict(totals)


_ADDED: dict[str, Insert] = {}


def _added(dialect: str) -> Insert:
    """The statement that adds a row's ``bytes`` to the total of its ``tenant_uid``: one
    statement a dialect, compiled once (a change's rows are its parameters)."""
    statement = _ADDED.get(dialect)
    if statement is None:
        upsert: Any = (
            postgresql.insert(StorageUsageRow)
            if dialect == "postgresql"
            else sqlite.insert(StorageUsageRow)
        )
        statement = _ADDED[dialect] = upsert.on_conflict_do_update(
            index_elements=[USAGE.c.tenant_uid],
            set_={"bytes": USAGE.c.bytes + upsert.excluded.bytes},
        )
    return statement


def _rows(changes: Mapping[str, int]) -> list[dict[str, Any]]:
    """``changes`` (tenant uid -> bytes) as the rows of :func:`_added`, in the order of the
    uids, leaving out those that change nothing."""
    return [
        {"tenant_uid": tenant_uid, "bytes": size}
        for tenant_uid, size in sorted(changes.items())
        if size
    ]


async def add(session: AsyncSession, changes: Mapping[str, int]) -> None:
    """Add ``changes`` (tenant uid -> bytes, negative for rows deleted) to the totals, in
    ``session``'s transaction."""
    if rows := _rows(changes):
        await session.execute(_added(session.get_bind().dialect.name), rows)


async def deleted(session: AsyncSession, statement: ReturningDelete[str, int]) -> int:
    """Run ``statement``, a delete returning each row's tenant uid and its size negated, and
    take the rows' bytes off their tenants' totals, in ``session``'s transaction; how many
    rows it deleted."""
    rows = (await session.execute(statement)).all()
    await add(session, tally((tenant_uid, size) for tenant_uid, size in rows))
    return len(rows)


def add_on(connection: Connection, changes: Mapping[str, int]) -> None:
    """:func:`add`, on a synchronous connection."""
    if rows := _rows(changes):
        connection.execute(_added(connection.dialect.name), rows)


def inserted_and_counted(table: Table, size_column: str) -> Insert:
    """For PostgreSQL: one row of ``table`` inserted and its ``size_column`` added to its
    tenant's total by one statement (a data-modifying CTE), for an ``executemany`` whose rows
    are all one transaction; its rows go in the order of their tenants' uids."""
    saved = (
        insert(table)
        .values({column.name: bindparam(column.name, type_=column.type) for column in table.c})
        .returning(table.c.tenant_uid, table.c[size_column].label("bytes"))
        .cte("saved")
    )
    statement = postgresql.insert(StorageUsageRow).from_select(
        ["tenant_uid", "bytes"], select(saved.c.tenant_uid, saved.c.bytes)
    )
    return statement.on_conflict_do_update(
        index_elements=[USAGE.c.tenant_uid],
        set_={"bytes": USAGE.c.bytes + statement.excluded.bytes},
    )
