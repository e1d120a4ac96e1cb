"""One batch of rows inserted in one transaction, with as few waits on the event loop as the
store allows: what a group commit (:mod:`app.store.responses`) awaits on a request's path.

Through the shared engine's sessions one transaction is many waits, and on a busy gateway each
wait is a turn of the event loop: on SQLite each statement is three calls to the driver's
thread (the cursor made, the statement run, the cursor closed), with BEGIN IMMEDIATE and COMMIT
besides; on PostgreSQL the checkout's ping is a transaction of its own (three round trips),
then BEGIN, the insert and COMMIT. So an inserter keeps a connection of its own:

* SQLite (a file): a synchronous connection on a thread of its own, which runs the whole
  transaction (BEGIN IMMEDIATE, the INSERT's ``executemany``, COMMIT) in one call: one wait;
* PostgreSQL: a connection in autocommit, where one ``executemany`` is atomic by itself
  (asyncpg sends every row, then one Sync): the ping and the insert, two round trips;
* SQLite in memory (which another connection would not see): the shared engine's sessions.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Engine, Table, insert
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.store.db import create_sync_sqlite_engine, sqlite_file

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


def batch_inserter(sessions: async_sessionmaker[AsyncSession], table: Table) -> BatchInserter:
    """The inserter for the store behind ``sessions`` (see the module)."""
    bind = sessions.kw["bind"]
    assert isinstance(bind, AsyncEngine)
    backend = bind.url.get_backend_name()
    if backend == "sqlite" and sqlite_file(bind.url.render_as_string(False)) is not None:
        return _SqliteThreadInserter(bind, table)
    if backend == "postgresql":
        return _AutocommitInserter(bind, table)
    return _SessionInserter(sessions, table)


class _SessionInserter(BatchInserter):
    def __init__(self, sessions: async_sessionmaker[AsyncSession], table: Table) -> None:
        self._sessions = sessions
        self._table = table

    async def insert(self, rows: list[Row]) -> None:
        async with self._sessions.begin() as session:
            await session.execute(insert(self._table), rows)

    async def close(self) -> None:
        pass  # the shared engine's, closed with it


class _SqliteThreadInserter(BatchInserter):
    """The transaction in one call on a thread of its own."""

    def __init__(self, bind: AsyncEngine, table: Table) -> None:
        self._url = bind.url
        self._table = table
        self._engine: Engine | None = None
        self._thread: ThreadPoolExecutor | None = None

    async def insert(self, rows: list[Row]) -> None:
        if self._thread is None:
            self._engine = create_sync_sqlite_engine(self._url)
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"{self._table.name}-writer")
        await asyncio.get_running_loop().run_in_executor(self._thread, self._insert, rows)

    def _insert(self, rows: list[Row]) -> None:
        assert self._engine is not None
        with self._engine.begin() as connection:
            connection.execute(insert(self._table), rows)

    async def close(self) -> None:
        thread, engine = self._thread, self._engine
        self._thread = self._engine = None
        if thread is not None and engine is not None:
            await asyncio.get_running_loop().run_in_executor(thread, engine.dispose)
            thread.shutdown()


class _AutocommitInserter(BatchInserter):
    def __init__(self, bind: AsyncEngine, table: Table) -> None:
        self._url = bind.url
        self._table = table
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
        async with self._engine.connect() as connection:
            await connection.execute(insert(self._table), rows)

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.dispose()
