"""A batch inserter on SQLite and PostgreSQL: a batch is one statement, all of it stored or none,
readable through the shared engine once the insert returns; on SQLite the whole transaction
runs in one call on the inserter's thread, off the event loop; on PostgreSQL no BEGIN or
COMMIT is sent (the statement is its own transaction)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, Pool, event, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.batch_insert import BatchInserter, batch_inserter
from app.store.db import now
from app.store.tables import StoredResponseRow
from tests.support.stored_bytes import summed, totals

TABLE = StoredResponseRow.__table__


def row(response_id: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "tenant_uid": "uid-a",
        "model": "notes",
        "adapter": None,
        "adapter_version": None,
        "body": {"id": response_id, "status": "completed"},
        "status": "completed",
        "input_items": [],
        "context": [],
        "size_bytes": 10,
        "created_at": now(),
    }


@pytest.fixture
async def inserter(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[BatchInserter]:
    inserter = batch_inserter(sessions, TABLE)  # type: ignore[arg-type]
    try:
        yield inserter
    finally:
        await inserter.close()


async def stored_ids(sessions: async_sessionmaker[AsyncSession]) -> list[str]:
    async with sessions() as session:
        return sorted((await session.scalars(select(StoredResponseRow.id))).all())


@contextmanager
def statements() -> Iterator[list[tuple[str, int]]]:
    """Each statement any engine sends meanwhile (its first word) and the thread it ran on."""
    seen: list[tuple[str, int]] = []

    def sent(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append((statement.split()[0].upper(), threading.get_ident()))

    event.listen(Engine, "before_cursor_execute", sent)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", sent)


async def test_a_batch_is_one_statement_stored_whole_or_not_at_all(
    sessions: async_sessionmaker[AsyncSession], inserter: BatchInserter
) -> None:
    with statements() as seen:
        await inserter.insert([row("resp_1"), row("resp_2"), row("resp_3")])
    assert [word for word, _ in seen if word != "BEGIN"] == ["INSERT"]
    assert await stored_ids(sessions) == ["resp_1", "resp_2", "resp_3"]

    with pytest.raises(IntegrityError):
        await inserter.insert([row("resp_4"), row("resp_2")])
    assert await stored_ids(sessions) == ["resp_1", "resp_2", "resp_3"]


async def test_the_write_waits_on_the_event_loop_once(
    database_url: str, sessions: async_sessionmaker[AsyncSession], inserter: BatchInserter
) -> None:
    """SQLite: BEGIN, the INSERT and COMMIT in one call on one thread, not the loop's.
    PostgreSQL: the INSERT alone, no BEGIN or COMMIT (round trips, each a turn of the loop)."""
    on_thread: list[int] = []
    sent: list[str] = []

    def commit(_conn: Any) -> None:
        on_thread.append(threading.get_ident())

    def log_queries(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        driver = record.driver_connection
        if hasattr(driver, "add_query_logger"):  # asyncpg's
            driver.add_query_logger(lambda query: sent.append(query.query))

    await inserter.insert([row("resp_0")])  # connected, and the dialect's first queries made
    event.listen(Engine, "commit", commit)
    event.listen(Pool, "checkout", log_queries)
    try:
        with statements() as seen:
            await inserter.insert([row("resp_1"), row("resp_2")])
        await asyncio.sleep(0)  # asyncpg calls its query loggers soon after, on the loop
    finally:
        event.remove(Engine, "commit", commit)
        event.remove(Pool, "checkout", log_queries)
    assert await stored_ids(sessions) == ["resp_0", "resp_1", "resp_2"]
    if database_url.startswith("sqlite"):
        assert [word for word, _ in seen] == ["BEGIN", "INSERT"]
        threads = {thread for _, thread in seen} | set(on_thread)
        assert len(on_thread) == 1 and len(threads) == 1
        assert threads != {threading.get_ident()}
    else:
        assert [query.split()[0].upper() for query in sent if query != ";"] == ["INSERT"]


async def test_a_counted_batch_adds_its_sizes_to_its_tenants_totals_in_its_transaction(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """SQLite: the count is a second statement in the insert's transaction. PostgreSQL: each
    row's insert and count are one statement, the batch one round trip as before."""
    counted = batch_inserter(sessions, TABLE, counted="size_bytes")  # type: ignore[arg-type]
    try:
        rows = [row(f"resp_{n}") | {"tenant_uid": f"uid-{n % 2}"} for n in range(5)]
        with statements() as seen:
            await counted.insert(rows)
        with pytest.raises(IntegrityError):
            await counted.insert([row("resp_5"), row("resp_0")])
    finally:
        await counted.close()
    assert await totals(sessions) == await summed(sessions) == {"uid-0": 30, "uid-1": 20}
    words = [word for word, _ in seen if word != "BEGIN"]
    assert words == (["INSERT", "INSERT"] if database_url.startswith("sqlite") else ["WITH"])
