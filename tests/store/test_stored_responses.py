"""Stored responses on SQLite and PostgreSQL: a tenant's own, found by no other; expired ones
not found, then purged in batches, the fresh ones kept; input items paged as OpenAI pages."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.responses import ResponseStore, StoredResponse, page
from app.store.tables import StoredResponseRow

DAY = timedelta(days=1)


def stored(response_id: str) -> StoredResponse:
    return StoredResponse(
        id=response_id,
        model="notes",
        adapter="scribe",
        adapter_version=3,
        body={"id": response_id, "output": [{"type": "message", "content": [{"text": "é"}]}]},
        input_items=[{"id": "msg_1", "type": "message"}],
        context=[{"id": "msg_0", "type": "message"}],
    )


async def test_a_response_is_its_tenants_alone(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    store = ResponseStore(sessions, 30 * DAY)
    await store.save("uid-a", stored("resp_1"))
    found = await store.get("uid-a", "resp_1")
    assert found == stored("resp_1")
    assert found.chain == [*found.context, *found.input_items, *found.body["output"]]
    assert await store.get("uid-b", "resp_1") is None
    assert not await store.delete("uid-b", "resp_1")
    assert await store.delete("uid-a", "resp_1")
    assert await store.get("uid-a", "resp_1") is None


async def test_expired_responses_are_not_found_then_purged_in_batches(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    store = ResponseStore(sessions, 30 * DAY)
    for n in range(6):
        await store.save("uid-a", stored(f"resp_{n}"))
    old = datetime.now(timezone.utc) - 31 * DAY
    async with sessions.begin() as session:
        await session.execute(
            update(StoredResponseRow).where(StoredResponseRow.id != "resp_5").values(created_at=old)
        )
    assert await store.get("uid-a", "resp_0") is None
    assert await store.purge(batch=2) == 5
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
