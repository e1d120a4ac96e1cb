"""One batch of rows inserted in one transaction, with as few waits on the event loop as the
store allows: what a group commit (:mod:`app.store.responses`) awaits on a request's path.

On a SQLite file the transaction runs in one call on a thread of its own
(:mod:`app.store.transactions`). On PostgreSQL the checkout's ping of the shared engine is a
transaction of its own (three round trips), then BEGIN, the insert and COMMIT; so the inserter
keeps a connection of its own in autocommit, where one ``executemany`` is atomic by itself
(asyncpg sends every row, then one Sync): the ping and the insert, two round trips. Elsewhere
(SQLite in memory) the shared engine's sessions.

An inserter may count its rows' sizes in their tenants' stored bytes
(:mod:`app.store.storage_usage`), in the same transaction: on SQLite a second statement; on
PostgreSQL each row's insert and count are one statement, which keeps the two round trips.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import partial
from typing import Any

from sqlalchemy import Connection, Executable, Table, insert
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.store.storage_usage import add_on, inserted_and_counted, tally
from app.store.transactions import Transactions, transactions

Row = dict[str, Any]


class BatchInserter(ABC):
    """Inserts rows into one table, a batch per transaction. Not for calls at once: a group
    commit's writer sends one batch at a time."""

    @abstractmethod
    async def insert(self, rows: list[Row]) -> None:
        """Insert ``rows``, all or none; raises what the store raised."""

    @abstractmethod
    async def close(self) -> None:
        """Close the inserter's own connection, if it has one."""


def batch_inserter(
    sessions: async_sessionmaker[AsyncSession], table: Table, *, counted: str | None = None
) -> BatchInserter:
    """The inserter for the store behind ``sessions`` (see the module); ``counted``, the
    column whose value each row adds to its tenant's stored bytes (a ``tenant_uid`` column
    names the tenant)."""
    bind = sessions.kw["bind"]
    assert isinstance(bind, AsyncEngine)
    if bind.url.get_backend_name() == "postgresql":
        return _AutocommitInserter(bind, table, counted)
    return _TransactionInserter(transactions(sessions, f"{table.name}-writer"), table, counted)


class _TransactionInserter(BatchInserter):
    def __init__(self, transactions: Transactions, table: Table, counted: str | None) -> None:
        self._transactions = transactions
        self._table = table
        self._counted = counted

    async def insert(self, rows: list[Row]) -> None:
        await self._transactions.run(partial(_insert, self._table, self._counted, rows))

    async def close(self) -> None:
        await self._transactions.close()


def _insert(table: Table, counted: str | None, rows: list[Row], connection: Connection) -> None:
    connection.execute(insert(table), rows)
    if counted is not None:
        add_on(connection, tally((row["tenant_uid"], row[counted]) for row in rows))


class _AutocommitInserter(BatchInserter):
    def __init__(self, bind: AsyncEngine, table: Table, counted: str | None) -> None:
        self._url = bind.url
        self._statement: Executable = (
            insert(table) if counted is None else inserted_and_counted(table, counted)
        )
        self._counted = counted
        self._engine: AsyncEngine | None = None

    async def insert(self, rows: list[Row]) -> None:
        if self._engine is None:
            # One connection: the writer sends a batch at a time; a spare for a reconnect.
            self._engine = create_async_engine(
                self._url,
                isolation_level="AUTOCOMMIT",
                pool_size=1,
                max_overflow=1,
                pool_pre_ping=True,
            )
        if self._counted is not None:
            rows = sorted(rows, key=lambda row: str(row["tenant_uid"]))
        async with self._engine.connect() as connection:
            await connection.execute(self._statement, rows)

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.dispose()
