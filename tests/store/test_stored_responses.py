"""Stored responses on SQLite and PostgreSQL: a tenant's own, found by no other; saved
together (one insert for the responses that finish at once, a refused one failing alone);
kept without waiting, found on their replica before they are written and on another once
they arrive, their writes retried while the store is down; expired ones not found, then
purged in batches, the fresh ones kept; input items paged as OpenAI pages."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.ids import time_ordered_hex
from app.store import responses
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


def slowed(store: ResponseStore, seconds: float, failures: list[Exception] | None = None) -> None:
    """``store``'s writes start ``seconds`` late, and the first raise ``failures`` in turn."""
    insert = store._inserter.insert
    failing = list(failures or [])

    async def late(rows: list[dict[str, Any]]) -> None:
        await asyncio.sleep(seconds)
        if failing:
            raise failing.pop(0)
        await insert(rows)

    store._inserter.insert = late  # type: ignore[method-assign]


async def test_a_kept_response_is_read_on_its_replica_at_once_and_on_another_once_it_arrives(
    sessions: async_sessionmaker[AsyncSession],
    store: ResponseStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(responses, "ARRIVAL_WAIT", 0.6)
    other = ResponseStore(sessions, 30 * DAY)
    young = f"resp_{time_ordered_hex()}"
    slowed(store, 0.3)
    try:
        with statements_on_responses() as seen:
            store.keep("uid-a", stored(young))
            assert await store.get("uid-a", young) == stored(young)
            assert seen == [], "read from memory: no query, and not yet written"
        # Another replica misses it until its write arrives: a young id is looked for again.
        started = time.monotonic()
        assert await other.get("uid-a", young) == stored(young)
        assert time.monotonic() - started >= 0.1
        assert store._unwritten == {}
        # Another tenant's, before its write or after: not found, on either replica.
        unwritten = f"resp_{time_ordered_hex()}"
        store.keep("uid-a", stored(unwritten))
        assert await store.get("uid-b", unwritten) is None
        assert await other.get("uid-b", young) is None
    finally:
        await other.close()


async def test_a_missing_id_is_looked_for_again_only_while_it_is_young(
    store: ResponseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(responses, "ARRIVAL_WAIT", 0.2)
    started = time.monotonic()
    assert await store.get("uid-a", f"resp_{time_ordered_hex()}") is None
    assert time.monotonic() - started >= 0.15  # from the id's time, made to the millisecond
    # An old id, and one not of an id's form: read once, not looked for again.
    with statements_on_responses() as seen:
        assert await store.get("uid-a", "resp_0123456789abcdef0123456789abcdef") is None
        assert await store.get("uid-a", "resp_unknown") is None
    assert seen == ["SELECT", "SELECT"]


async def test_a_kept_responses_write_is_retried_while_the_store_is_down_and_a_refused_one_logged(
    store: ResponseStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(responses, "RETRY_PAUSE", 0.01)
    down = OperationalError("INSERT", {}, ConnectionError("the store is down"))
    slowed(store, 0, [down, down])
    store.keep("uid-a", stored("resp_1"))
    await store.written()
    assert await store.get("uid-a", "resp_1") == stored("resp_1")
    # Refused for what it is (an id taken): lost, and logged; the store goes on.
    with caplog.at_level(logging.ERROR, logger=responses.__name__):
        store.keep("uid-a", stored("resp_1"))
        store.keep("uid-a", stored("resp_2"))
        await store.written()
    assert "stored response resp_1 was lost" in caplog.text
    assert await store.get("uid-a", "resp_2") == stored("resp_2")
    # A saved one (its caller waits) fails at once, not retried.
    slowed(store, 0, [down])
    with pytest.raises(OperationalError):
        await store.save("uid-a", stored("resp_3"))


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
