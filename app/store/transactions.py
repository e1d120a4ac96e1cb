"""A store's transaction written as one synchronous function of a connection, run with as
few waits on the event loop as the store allows: for writers that do not need a session.

Through the shared engine's sessions one transaction is many waits, and on a busy gateway each
wait is a turn of the event loop: on SQLite each statement is three calls to the driver's
thread (the cursor made, the statement run, the cursor closed), with BEGIN IMMEDIATE and COMMIT
besides, each call a handoff between threads. So on a SQLite file the transaction runs on a
synchronous connection and a thread of its own, in one call: one wait. On PostgreSQL (asyncpg
talks to the server from the event loop itself: the round trips are the waits) and on SQLite
in memory (which another connection would not see) it runs in a session of the shared engine.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.store.db import create_sync_sqlite_engine, sqlite_file

T = TypeVar("T")

Work = Callable[[Connection], T]
"""A transaction's statements, on the connection it runs on; committed when it returns,
rolled back when it raises."""


class Transactions(ABC):
    """Runs transactions (:data:`Work`), one at a time."""

    @abstractmethod
    async def run(self, work: Work[T]) -> T:
        """``work``'s result once committed; raises what it or the store raised."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection of its own, if it has one; a later :meth:`run` opens it again."""


def transactions(sessions: async_sessionmaker[AsyncSession], name: str) -> Transactions:
    """Transactions on the store behind ``sessions`` (see the module); ``name`` names the
    thread of its own, where it has one."""
    bind = sessions.kw["bind"]
    assert isinstance(bind, AsyncEngine)
    if bind.url.get_backend_name() == "sqlite" and sqlite_file(str(bind.url)) is not None:
        return _SqliteThread(bind, name)
    return _SharedSessions(sessions)


class _SharedSessions(Transactions):
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def run(self, work: Work[T]) -> T:
        async with self._sessions.begin() as session:
            return await session.run_sync(lambda sync: work(sync.connection()))

    async def close(self) -> None:
        pass  # the shared engine's, closed with it


class _SqliteThread(Transactions):
    """The transaction in one call, on a connection and a thread of its own."""

    def __init__(self, bind: AsyncEngine, name: str) -> None:
        self._url = bind.url
        self._name = name
        self._engine: Engine | None = None
        self._thread: ThreadPoolExecutor | None = None

    async def run(self, work: Work[T]) -> T:
        if self._thread is None:
            self._engine = create_sync_sqlite_engine(self._url)
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=self._name)
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._run, work)

    def _run(self, work: Work[T]) -> T:
        assert self._engine is not None
        with self._engine.begin() as connection:
            return work(connection)

    async def close(self) -> None:
        thread, engine = self._thread, self._engine
        self._thread = self._engine = None
        if thread is not None and engine is not None:
            await asyncio.get_running_loop().run_in_executor(thread, engine.dispose)
            thread.shutdown()
