"""Whether anything was committed to the store since a poller last read it.

Every replica polls the store: for changes other replicas made to the registry, for batches to
run. On SQLite each poll is a query through the driver's thread, about a millisecond of CPU,
several times a second, idle or not. SQLite counts commits: ``PRAGMA data_version``, read on a
connection of its own, moves whenever any other connection (any process, this one's pool
included) has committed, and reading it takes microseconds on the event loop. A poller that
notes the version before its query, and finds it unchanged at its next poll, knows its query
would read what it read then. PostgreSQL has no such counter: there every poll queries.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.db import sqlite_file


class StoreVersion:
    """The store's commit count where the store can tell it (a SQLite file), else None."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._path = sqlite_file(str(sessions.kw["bind"].url))
        self._connection: sqlite3.Connection | None = None

    def current(self) -> int | None:
        """A number that differs from any earlier one once anything has been committed since
        (by a connection other than this object's, which never writes); None where the store
        cannot tell, and where reading it failed (so a poller queries)."""
        if self._path is None:
            return None
        try:
            if self._connection is None:
                self._connection = sqlite3.connect(self._path, isolation_level=None)
            return int(self._connection.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            self.close()
            return None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
