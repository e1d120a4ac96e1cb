"""Whether anything was committed to the store since a poller last read it.

Every replica polls the store: for changes other replicas made to the registry, for batches to
run. On SQLite each poll is a query through the driver's thread, about a millisecond of CPU,
several times a second, idle or not. SQLite counts commits: ``PRAGMA data_version``, read on a
connection of its own, moves whenever any other connection (any process, this one's pool
included) has committed, and reading it takes microseconds on the event loop. A poller that
notes the version before its query, and finds it unchanged at its next poll, knows its query
would read what it read then. PostgreSQL has no such counter: there every poll queries.

Under load the version moves every second (the usage ledger commits), and the polls query. On
SQLite they read on the same connection, at once, on the event loop: a poll's read is one
indexed lookup, microseconds, where a session through the driver's thread costs a millisecond.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import Select
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.db import reading, sqlite_file


class StoreVersion:
    """The store's commit count, and a poll's reads, where the store is a SQLite file."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._path = sqlite_file(str(sessions.kw["bind"].url))
        self._connection: sqlite3.Connection | None = None
        self._statements: dict[Select[Any], str] = {}

    def current(self) -> int | None:
        """A number that differs from any earlier one once anything has been committed since
        (by a connection other than this object's, which never writes); None where the store
        cannot tell, and where reading it failed (so a poller queries)."""
        rows = self._execute("PRAGMA data_version")
        return None if rows is None else int(rows[0][0])

    def read(self, query: Select[Any]) -> list[Any] | None:
        """The first column of ``query``'s rows, read at once on this object's connection:
        for a poll's small read of columns stored as their Python values (ids, counters), whose
        query stays the same object. None where the store is not a SQLite file, and where the
        read failed (it never waits for a lock), so that the poller reads through a session."""
        if self._path is None:
            return None
        statement = self._statements.get(query)
        if statement is None:
            inlined = {"literal_binds": True}  # its values in the statement
            compiled = query.compile(dialect=sqlite.dialect(), compile_kwargs=inlined)
            statement = self._statements[query] = str(compiled)
        rows = self._execute(statement)
        return None if rows is None else [row[0] for row in rows]

    def _execute(self, statement: str) -> list[Any] | None:
        if self._path is None:
            return None
        try:
            if self._connection is None:
                # No wait for a lock: the event loop reads.
                self._connection = sqlite3.connect(self._path, isolation_level=None, timeout=0)
            return self._connection.execute(statement).fetchall()
        except sqlite3.Error:
            self.close()
            return None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


async def polled(
    sessions: async_sessionmaker[AsyncSession], version: StoreVersion | None, query: Select[Any]
) -> list[Any]:
    """The first column of ``query``'s rows, for a poll: read by ``version`` where it can,
    else through a session that takes no write lock."""
    rows = version.read(query) if version is not None else None
    if rows is None:
        async with reading(sessions) as session:
            rows = list((await session.scalars(query)).all())
    return rows
