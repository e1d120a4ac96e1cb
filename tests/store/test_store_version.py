"""A poll's reads on the store's own connection (``StoreVersion``): the same values as a
session reads, on SQLite; nothing on PostgreSQL, whose pollers read through a session."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, Table, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin.mutations import bump_revision
from app.store.changes import StoreVersion
from app.store.snapshot import REVISION, revision


async def test_a_poll_reads_what_a_session_reads_and_follows_commits(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    version = StoreVersion(sessions)
    on_sqlite = sessions.kw["bind"].dialect.name == "sqlite"
    try:
        first = await revision(sessions)
        assert version.read(REVISION) == ([first] if on_sqlite else None)
        seen = version.current()
        async with sessions.begin() as session:
            await bump_revision(session)
        assert await revision(sessions, version) == first + 1
        assert version.read(REVISION) == ([first + 1] if on_sqlite else None)
        assert (version.current() != seen) if on_sqlite else version.current() is None
    finally:
        version.close()


async def test_a_read_that_fails_leaves_the_poll_to_a_session(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    if sessions.kw["bind"].dialect.name != "sqlite":
        return  # PostgreSQL: every poll reads through a session (the test above)
    version = StoreVersion(sessions)
    missing = select(Table("not_migrated_yet", MetaData(), Column("id", Integer)).c.id)
    try:
        assert version.read(missing) is None  # the poller reads through a session
        expected = await revision(sessions)
        assert version.read(REVISION) == [expected]  # on a new connection
    finally:
        version.close()
