"""Stored responses on SQLite and PostgreSQL: a tenant's own, found by no other; saved
together (one insert for the responses that finish at once, a refused one failing alone);
expired ones not found, then purged in batches, the fresh ones kept; input items paged as
OpenAI pages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.responses import ResponseStore, StoredResponse, page
from app.store.tables import StoredResponseRow
from tools.responses_store_bench import _typical

DAY = timedelta(days=1)


def stored(response_id: str) -> StoredResponse:
    return StoredResponse(
        id=response_id,
        model="notes",
        adapter="scribe",
        adapter_version=3,
        body={
            "id": response_id,
            "status": "completed",
            "output": [{"type": "message", "content": [{"text": "é"}]}],
        },
        input_items=[{"id": "msg_1", "type": "message"}],
        context=[{"id": "msg_0", "type": "message"}],
    )


@pytest.fixture
async def store(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[ResponseStore]:
    store = ResponseStore(sessions, 30 * DAY)
    try:
        yield store
    finally:
        await store.close()


async def test_a_response_is_its_tenants_alone(
    store: ResponseStore,
) -> None:
    await store.save("uid-a", stored("resp_1"))
    found = await store.get("uid-a", "resp_1")
    assert found == stored("resp_1")
    assert found.chain == [*found.context, *found.input_items, *found.body["output"]]
    assert await store.get("uid-b", "resp_1") is None
    assert not await store.delete("uid-b", "resp_1")
    assert await store.delete("uid-a", "resp_1")
    assert await store.get("uid-a", "resp_1") is None


@contextmanager
def statements_on_responses() -> Iterator[list[str]]:
    """The first word of each statement sent on the stored responses' table meanwhile, by any
    engine (the store writes through a connection of its own)."""
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "stored_responses" in statement:
            seen.append(statement.split()[0].upper())

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", count)


async def test_responses_saved_at_once_are_one_insert_and_a_refused_one_fails_alone(
    store: ResponseStore,
) -> None:
    await store.save("uid-a", stored("resp_taken"))
    with statements_on_responses() as seen:
        saved = await asyncio.gather(*(store.save("uid-a", stored(f"resp_{n}")) for n in range(8)))
    # One statement (on PostgreSQL a WITH: each row's insert and its count in its tenant's
    # stored bytes, run for every row in one round trip).
    assert saved == [None] * 8 and len(seen) == 1 and seen[0] in ("INSERT", "WITH")
    assert all([await store.get("uid-a", f"resp_{n}") for n in range(8)])

    # One id already stored: its save fails; the others saved with it are stored.
    ids = ["resp_new_1", "resp_taken", "resp_new_2"]
    outcomes = await asyncio.gather(
        *(store.save("uid-a", stored(i)) for i in ids), return_exceptions=True
    )
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], IntegrityError)
    assert await store.get("uid-a", "resp_new_1") and await store.get("uid-a", "resp_new_2")


async def test_expired_responses_are_not_found_then_purged_in_batches(
    sessions: async_sessionmaker[AsyncSession], store: ResponseStore
) -> None:
    for n in range(6):
        await store.save("uid-a", stored(f"resp_{n}"))
    old = datetime.now(timezone.utc) - 31 * DAY
    async with sessions.begin() as session:
        await session.execute(
            update(StoredResponseRow).where(StoredResponseRow.id != "resp_5").values(created_at=old)
        )
    assert await store.get("uid-a", "resp_0") is None
    with statements_on_responses() as seen:
        assert await store.purge(batch=2) == 5
    # Three transactions of at most two rows each (the third finds one, and ends the purge).
    assert seen == ["SELECT", "DELETE"] * 3
    async with sessions() as session:
        left = (await session.scalars(select(StoredResponseRow.id))).all()
        assert await session.scalar(select(func.count()).select_from(StoredResponseRow)) == 1
    assert left == ["resp_5"]
    assert await store.purge(batch=2) == 0


def test_items_are_paged_after_an_id_in_either_order() -> None:
    items = [{"id": f"i{n}"} for n in range(5)]
    first = page(items, after=None, limit=2, order="desc")
    assert first is not None and [i["id"] for i in first.items] == ["i4", "i3"] and first.has_more
    rest = page(items, after="i1", limit=2, order="desc")
    assert rest is not None and [i["id"] for i in rest.items] == ["i0"] and not rest.has_more
    exact = page(items, after="i2", limit=2, order="asc")
    assert exact is not None and [i["id"] for i in exact.items] == ["i3", "i4"]
    assert not exact.has_more
    assert page(items, after="unknown", limit=2, order="asc") is None


async def test_the_store_benchmarks_timed_response_is_one_the_store_saves(
    store: ResponseStore,
) -> None:
    await store.save("bench", _typical("resp_1"))
    assert await store.get("bench", "resp_1") == _typical("resp_1")
