"""Batches, their files and their lines on SQLite and PostgreSQL: a line finishes once,
with what ``also`` writes in its transaction; progress counted; the tenant's files paged
newest first; the usage rows of batch lines told from online ones; the tenant's storage room
read by one query that waits for no writer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin import schemas
from app.admin.service import AdminService
from app.errors import StorageLimitError
from app.serving.batches.files import Files
from app.store import storage_usage
from app.store.batches import BatchStore, EnqueuedLimitPassed, PendingLine
from app.store.file_contents import LocalFileContents
from app.store.files import FileStore, new_file_id
from app.store.tables import BatchRow, StoredResponseRow, UsageRow
from app.tenancy.tenants import Tenant
from app.usage import UsageRecord, usage_by_bucket
from app.usage.ledger import write_records
from tests.support.batch_rows import batch_row as support_batch_row

NOW = datetime.now(timezone.utc)


def batch_row(tenant_uid: str = "uid-a", tenant_id: str = "a") -> BatchRow:
    return support_batch_row(tenant_uid, tenant_id, NOW)


def record(request_id: str, batch_id: str | None) -> UsageRecord:
    return UsageRecord(
        request_id=request_id,
        tenant_id="a",
        tenant_uid="uid-a",
        key_id="key",
        endpoint="chat.completions",
        model="m",
        adapter=None,
        adapter_version=None,
        prompt_tokens=3,
        completion_tokens=5,
        status="ok",
        latency_ms=1,
        started_at=NOW,
        finished_at=NOW,
        batch_id=batch_id,
    )


async def test_a_line_finishes_once_with_its_usage_record(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    store = BatchStore(sessions)
    batch = await store.create(batch_row())
    lines = [PendingLine(n, f"c{n}", {"n": n}) for n in (1, 2, 3)]
    await store.add_lines(batch.id, lines)
    assert await store.start(batch.id, len(lines), {"m": None})
    assert not await store.start(batch.id, len(lines), {}), "started once"
    assert [line.line for line in await store.pending(batch.id, after=1, limit=1)] == [2]
    assert [line.line for line in await store.pending(batch.id)] == [1, 2, 3]

    async def billed(session: AsyncSession, request_id: str) -> None:
        await write_records(session, [record(request_id, batch.id)])

    output: dict[str, Any] = {"custom_id": "c2"}
    assert await store.finish_line(
        batch.id, 2, "ok", output, also=lambda s: billed(s, f"{batch.id}-2")
    )
    assert not await store.finish_line(
        batch.id, 2, "ok", output, also=lambda s: billed(s, f"{batch.id}-2-again")
    ), "a finished line is never finished again, nor billed again"
    assert await store.finish_line(batch.id, 3, "error", {"custom_id": "c3"})
    after = await store.by_id(batch.id)
    assert after is not None
    assert (after.status, after.total, after.completed, after.failed) == ("in_progress", 3, 1, 1)
    assert [line.line for line in await store.pending(batch.id)] == [1]
    assert await store.outputs(batch.id, ("ok",)) == [(2, output)]
    # Read a page at a time, in line order.
    finished = ("ok", "error")
    assert await store.outputs(batch.id, finished, limit=1) == [(2, output)]
    assert await store.outputs(batch.id, finished, after=2) == [(3, {"custom_id": "c3"})]
    async with sessions() as session:
        ids = (await session.scalars(select(UsageRow.request_id))).all()
    assert ids == [f"{batch.id}-2"]

    # A line whose usage cannot be written is not finished either: one transaction.
    async def fails(session: AsyncSession) -> None:
        await billed(session, f"{batch.id}-2")  # the request id is taken: the insert fails

    with contextlib.suppress(IntegrityError):
        await store.finish_line(batch.id, 1, "ok", {"custom_id": "c1"}, also=fails)
    assert [line.line for line in await store.pending(batch.id)] == [1]


async def test_batches_and_files_page_newest_first_per_tenant(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    files = FileStore(sessions, timedelta(days=1), 1 << 20)
    made = [new_file_id() for _ in range(3)]
    for file_id in made:
        await files.add_within_cap("a", "uid-a", file_id, purpose="batch", filename="f", size=10)
    await files.add_within_cap("b", "uid-b", new_file_id(), purpose="batch", filename="f", size=7)
    first = await files.page("uid-a", after=None, limit=2, order="desc", purpose=None)
    assert first is not None and first.has_more and len(first.files) == 2
    rest = await files.page("uid-a", after=first.files[-1].id, limit=2, order="desc", purpose=None)
    assert rest is not None and not rest.has_more
    assert {f.id for f in first.files + rest.files} == set(made)
    assert await files.page("uid-b", after=made[0], limit=2, order="desc", purpose=None) is None
    assert await files.storage_used("uid-a") == 30

    store = BatchStore(sessions)
    batches = [await store.create(batch_row()) for _ in range(3)]
    await store.create(batch_row("uid-b"))
    page = await store.page("uid-a", after=None, limit=10)
    assert page is not None and {b.id for b in page.batches} == {b.id for b in batches}
    ordered = [(b.created_at, b.id) for b in page.batches]
    assert ordered == sorted(ordered, reverse=True)
    after_first = await store.page("uid-a", after=page.batches[0].id, limit=10)
    assert after_first is not None
    assert [b.id for b in after_first.batches] == [b.id for b in page.batches[1:]]


async def test_usage_tells_batch_lines_from_online_requests(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions.begin() as session:
        await write_records(session, [record("online", None), record("line", "batch_x")])
    start = int(NOW.timestamp()) - 10
    window = {"start": start, "end": start + 60, "width": 60}
    [batch_only] = await usage_by_bucket(sessions, "uid-a", batch=True, **window)
    [online_only] = await usage_by_bucket(sessions, "uid-a", batch=False, **window)
    assert batch_only.requests == online_only.requests == 1
    grouped = await usage_by_bucket(sessions, "uid-a", group_by={"batch"}, **window)
    assert sorted((t.batch, t.requests) for t in grouped) == [(False, 1), (True, 1)]
    async with sessions() as session:
        assert (await session.execute(select(func.count(UsageRow.id)))).scalar_one() == 2


async def tenant_with_quota(admin: AdminService, **quota: int) -> tuple[str, str]:
    """A tenant with ``quota``: its id and uid."""
    row = await admin.create_tenant("test", schemas.TenantCreate(id="acme", name="ACME"))
    await admin.put_quota("test", row.id, schemas.TenantQuotaPut(**quota))
    return row.id, row.uid


async def test_files_recorded_at_once_never_pass_the_storage_cap_together(
    sessions: async_sessionmaker[AsyncSession], admin: AdminService
) -> None:
    tenant_id, uid = await tenant_with_quota(admin, storage_bytes=1000)
    files = FileStore(sessions, timedelta(days=1), 1 << 20)

    async def add(size: int) -> bool:
        try:
            await files.add_within_cap(
                tenant_id, uid, new_file_id(), purpose="batch", filename="f", size=size
            )
        except StorageLimitError as refused:
            assert refused.param == "storage_bytes"
            return False
        return True

    await asyncio.gather(*(files.storage_used(uid) for _ in range(6)))  # connections open
    assert sum(await asyncio.gather(*(add(600) for _ in range(6)))) == 1
    assert await files.storage_used(uid) == 600
    assert await add(400), "up to the cap exactly"
    assert not await add(1)


async def test_batches_started_at_once_never_pass_the_enqueued_limit_together(
    sessions: async_sessionmaker[AsyncSession], admin: AdminService
) -> None:
    tenant_id, uid = await tenant_with_quota(admin, batch_tokens_enqueued=1000)
    store = BatchStore(sessions)
    batches = [await store.create(batch_row(uid, tenant_id)) for _ in range(6)]
    for batch in batches:
        await store.add_lines(batch.id, [PendingLine(1, "c", {}, cost=600)])

    async def start(batch_id: str) -> bool:
        try:
            return await store.start(batch_id, 1, {}, cost=600)
        except EnqueuedLimitPassed as passed:
            assert (passed.enqueued, passed.limit) == (600, 1000)
            return False

    await asyncio.gather(*(store.tokens_enqueued(uid) for _ in batches))  # connections open
    assert sum(await asyncio.gather(*(start(b.id) for b in batches))) == 1
    assert await store.tokens_enqueued(uid) == 600
    [running] = [b for b in batches if (await store.by_id(b.id)).status == "in_progress"]  # type: ignore[union-attr]
    assert not await store.start(running.id, 1, {}, cost=600), "started once"


async def test_result_files_are_recorded_only_with_the_batch_they_finish(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    store = BatchStore(sessions)
    files = FileStore(sessions, timedelta(days=1), 1 << 20)
    batch = await store.create(batch_row())
    output = files.row("uid-a", new_file_id(), purpose="batch_output", filename="o", size=9)
    assert not await store.move(
        batch.id, "completed", only_from=("finalizing",), files=[output], output_file_id=output.id
    )
    assert await files.storage_used("uid-a") == 0, "a batch that did not move records nothing"
    assert await store.move(
        batch.id, "completed", only_from=("validating",), files=[output], output_file_id=output.id
    )
    assert await files.storage_used("uid-a") == 9
    assert (await store.by_id(batch.id)).output_file_id == output.id  # type: ignore[union-attr]


async def test_the_room_check_is_one_read_that_waits_for_no_writer(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    files = FileStore(sessions, timedelta(days=1), 1 << 20)
    await files.add_within_cap("a", "uid-a", new_file_id(), purpose="batch", filename="f", size=30)
    async with sessions.begin() as session:
        await add_stored_response(session, "uid-a", size=12)
    sent: list[str] = []

    def statement(_conn: Any, _cursor: Any, text: str, *_: Any) -> None:
        sent.append(text)

    # A writer's transaction open meanwhile (on SQLite it holds the write lock).
    async with sessions.begin() as writer:
        await add_stored_response(writer, "uid-a", size=100)
        event.listen(Engine, "before_cursor_execute", statement)
        try:
            assert await files.storage_room("a", "uid-a") == (1 << 20, 42)
        finally:
            event.remove(Engine, "before_cursor_execute", statement)
    assert [text.split()[0] for text in sent if not text.startswith("BEGIN")] == ["SELECT"]
    assert "BEGIN IMMEDIATE" not in sent
    assert await files.storage_room("a", "uid-a") == (1 << 20, 142)


async def add_stored_response(session: AsyncSession, tenant_uid: str, size: int) -> None:
    """A stored response of ``size`` bytes added, and counted, in ``session``'s transaction
    (as :class:`ResponseStore` writes one)."""
    session.add(stored_response_row(tenant_uid, size))
    await storage_usage.add(session, {tenant_uid: size})


def stored_response_row(tenant_uid: str, size: int) -> StoredResponseRow:
    return StoredResponseRow(
        id=f"resp_{new_file_id()}",
        tenant_uid=tenant_uid,
        model="m",
        adapter=None,
        adapter_version=None,
        body={},
        status="completed",
        input_items=[],
        context=[],
        size_bytes=size,
        created_at=NOW,
    )


@contextlib.contextmanager
def selects_sent() -> Iterator[list[str]]:
    """The SELECTs sent meanwhile, by any engine."""
    selects: list[str] = []

    def statement(_conn: Any, _cursor: Any, text: str, *_: Any) -> None:
        if text.startswith("SELECT"):
            selects.append(text)

    event.listen(Engine, "before_cursor_execute", statement)
    try:
        yield selects
    finally:
        event.remove(Engine, "before_cursor_execute", statement)


async def test_the_room_checks_of_a_tenant_at_once_share_one_query(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    files = FileStore(sessions, timedelta(days=1), 1 << 20)
    await files.add_within_cap("a", "uid-a", new_file_id(), purpose="batch", filename="f", size=30)
    with selects_sent() as selects:
        at_once = await asyncio.gather(*(files.storage_room("a", "uid-a") for _ in range(5)))
        other = await files.storage_room("b", "uid-b")
        assert len(selects) == 2
        await files.add_within_cap(
            "a", "uid-a", new_file_id(), purpose="batch", filename="f", size=5
        )
        selects.clear()
        after = await files.storage_room("a", "uid-a")
    assert at_once == [(1 << 20, 30)] * 5 and other == (1 << 20, 0)
    assert after == (1 << 20, 35) and len(selects) == 1


async def test_a_room_seen_is_answered_without_a_query_and_read_again_before_it_is_old(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    files = FileStore(sessions, timedelta(days=1), 1 << 20)
    assert files.storage_room_seen("a", "uid-a", max_age=60) is None  # never read
    await files.add_within_cap("a", "uid-a", new_file_id(), purpose="batch", filename="f", size=30)
    assert await files.storage_room("a", "uid-a") == (1 << 20, 30)
    await files.add_within_cap("a", "uid-a", new_file_id(), purpose="batch", filename="f", size=5)
    with selects_sent() as selects:
        # Young: the reading as it was, and no query.
        assert files.storage_room_seen("a", "uid-a", max_age=60) == (1 << 20, 30)
        await asyncio.sleep(0.01)
        assert selects == []
        # Past half its age: the same reading, read again in the background for the next caller.
        read_at, room = files._room_seen["a", "uid-a"]
        files._room_seen["a", "uid-a"] = read_at - 40, room
        assert files.storage_room_seen("a", "uid-a", max_age=60) == (1 << 20, 30)
        assert files.storage_room_seen("a", "uid-a", max_age=60) == (1 << 20, 30)
        for _ in range(100):
            if files.storage_room_seen("a", "uid-a", max_age=60) == (1 << 20, 35):
                break
            await asyncio.sleep(0.01)
        assert files.storage_room_seen("a", "uid-a", max_age=60) == (1 << 20, 35)
        assert len(selects) == 1, "the two callers' reads again shared one query"
        # Older than asked for: none.
        read_at, room = files._room_seen["a", "uid-a"]
        files._room_seen["a", "uid-a"] = read_at - 40, room
        assert files.storage_room_seen("a", "uid-a", max_age=30) is None


async def test_a_check_passes_on_the_room_seen_and_refuses_on_a_fresh_reading(
    sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    store = FileStore(sessions, timedelta(days=1), 100)
    files = Files(store, LocalFileContents(tmp_path), tmp_path, max_bytes=1000, max_lines=10)
    tenant = Tenant(id="a", uid="uid-a", name="A")
    await files.check_room(tenant, 0, max_age=60)  # read: (100, 0)
    async with sessions.begin() as session:
        await add_stored_response(session, "uid-a", size=100)
    await files.check_room(tenant, 0, max_age=60)  # on the reading seen: it fits
    with pytest.raises(StorageLimitError):
        await files.check_room(tenant, 0)  # fresh: full
    async with sessions.begin() as session:
        await storage_usage.add(session, {"uid-a": -50})
    # Full as seen, but a refusal is read again: it fits.
    await files.check_room(tenant, 0, max_age=60)
    assert store.storage_room_seen("a", "uid-a", max_age=60) == (100, 50)
