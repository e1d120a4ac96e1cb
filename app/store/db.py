"""Database connections and start-up migrations.

SQLite is set up for more than one process writing at once (the server, and the CLI an operator
runs beside it): write-ahead logging (set in the file before it is opened), so readers and the
writer do not block each other; a busy timeout, so a writer waits for another's transaction
instead of failing with "database is locked"; and every transaction begun IMMEDIATE, so one that
reads and then writes takes the write lock before it reads (a deferred one could only fail, not
wait, if another process wrote in between), except one that says it only reads (:func:`reading`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 15_000
MIGRATION_LOCK_ID = 0x4C47_5753  # "LGWS": one advisory lock id for every replica's migration
TENANT_LOCK_SPACE = 0x4C47_5454  # "LGTT": the advisory locks of tenants' exact caps
UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57")
"""PostgreSQL's error classes that say the server cannot serve now, whatever was sent: a
connection exception, insufficient resources (too many connections, disk full), operator
intervention (shutting down, or starting up and recovering after a crash)."""


def now() -> datetime:
    """The time the store's rows are stamped with, and compared against: UTC."""
    return datetime.now(timezone.utc)


def store_is_down(exc: BaseException) -> bool:
    """Whether a call failed because of the store (the same call may succeed later), not because
    of what was sent (retrying cannot help). asyncpg's errors reach SQLAlchemy as its generic
    ``DBAPIError``, so a server that answers "starting up" is known by its SQLSTATE."""
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError)):
        return True
    # The driver's error: asyncpg's (as SQLAlchemy adapts it) and psycopg's carry the code.
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] in UNAVAILABLE_SQLSTATE_CLASSES


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


@functools.cache
def newest_revision() -> str | None:
    """The revision of the newest migration: the scripts read once per process."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _upgrade(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        # Replicas starting together would each run the same DDL: the first holds this lock
        # to its transaction's end, the others then find the schema at head. (SQLite's
        # BEGIN IMMEDIATE serialises them already.)
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_ID})")
    # A store already at the newest revision (every start but an upgrade's) is left as it is
    # without Alembic's upgrade, which reads and compiles every migration script each time
    # to find nothing to do. Any other revision, an unknown one included, is Alembic's.
    if MigrationContext.configure(connection).get_current_revision() == newest_revision():
        return
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def _configure_sqlite(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    # The driver's own BEGIN (deferred) is turned off: _begin_immediate issues ours.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def use_write_ahead_log(path: str) -> None:
    """Switch the SQLite file at ``path`` to write-ahead logging (kept in the file), once,
    before the engine opens it. Switching needs the file to itself, and SQLite answers "database
    is locked" at once, whatever the busy timeout, while another process or replica holds it
    (migrating, say): so this retries, for as long as the busy timeout, off the event loop."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        with contextlib.closing(sqlite3.connect(path, timeout=1.0)) as connection:
            try:
                if connection.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
                    return
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.05)


READ_ONLY = {"read_only": True}
"""Execution options of a session that only reads (:func:`reading`)."""


@asynccontextmanager
async def reading(
    sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncSession]:
    """A session that only reads: on SQLite its transaction begins DEFERRED, taking no write
    lock, so that it neither waits for a writer nor holds one up (write-ahead logging gives it
    a snapshot). It must not write: where another connection wrote since it read, SQLite fails
    its write at once instead of waiting."""
    async with sessions() as session:
        await session.connection(execution_options=READ_ONLY)
        yield session


def _begin_immediate(connection: Connection) -> None:
    if connection.get_execution_options().get("read_only"):
        connection.exec_driver_sql("BEGIN")
    else:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


async def lock_tenant(session: AsyncSession, tenant_uid: str) -> None:
    """Hold the tenant's lock until ``session``'s transaction ends, so that a cap checked
    (what is used, read) and then taken (a row written) in that transaction is exact: no
    other transaction holding the lock reads in between. On PostgreSQL an advisory lock keyed
    by the uid (every replica's transactions wait on it); on SQLite every transaction is
    begun IMMEDIATE, holding the one write lock from its start, which serialises them
    already."""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(
            text("SELECT pg_advisory_xact_lock(CAST(:space AS integer), hashtext(:uid))"),
            {"space": TENANT_LOCK_SPACE, "uid": tenant_uid},
        )


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite ``url``, its folder made; None for another database or memory."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def create_engine(url: str) -> AsyncEngine:
    if make_url(url).get_backend_name() == "sqlite":
        sqlite_file(url)
        engine = create_async_engine(url)
        event.listen(engine.sync_engine, "connect", _configure_sqlite)
        event.listen(engine.sync_engine, "begin", _begin_immediate)
        return engine
    return create_async_engine(url, pool_pre_ping=True)


def create_sync_sqlite_engine(url: URL) -> Engine:
    """A synchronous engine (the standard library's driver) on the SQLite file of the async
    ``url``, set up as :func:`create_engine`'s: for a writer whose whole transaction runs in
    one call on a thread of its own (:mod:`app.store.transactions`)."""
    engine = create_sync_engine(url.set(drivername="sqlite"), pool_size=1, max_overflow=0)
    event.listen(engine, "connect", _configure_sqlite)
    event.listen(engine, "begin", _begin_immediate)
    return engine


@asynccontextmanager
async def open_database(url: str) -> AsyncIterator[async_sessionmaker]:  # type: ignore[type-arg]
    """Migrate the schema to the latest revision, then hand out sessions."""
    if (path := sqlite_file(url)) is not None:
        await asyncio.to_thread(use_write_ahead_log, str(path))
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_upgrade)
        yield async_sessionmaker(engine, expire_on_commit=False)
    finally:
        await engine.dispose()
