"""Each tenant's stored bytes, a running total, on SQLite and PostgreSQL: after every write
that adds, resizes or deletes a file or a stored response (at once where they run at once,
from two replicas' stores, a refused one among them), the expiry purges and a tenant's
deletion, the totals equal a fresh sum of the rows, and the storage cap reads them. Migration
0015 fills them from the rows and goes back down."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from alembic import command
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin import schemas
from app.admin.service import AdminService
from app.errors import StorageLimitError
from app.store.batches import BatchStore
from app.store.db import alembic_config, create_engine, now
from app.store.files import FileStore, new_file_id
from app.store.responses import ResponseStore, StoredResponse
from app.store.tables import FileRow, StoredResponseRow
from tests.support.batch_rows import batch_row
from tests.support.stored_bytes import summed, totals

DAY = timedelta(days=1)


def response(response_id: str, status: str = "completed", text: str = "é") -> StoredResponse:
    return StoredResponse(
        id=response_id,
        model="notes",
        adapter=None,
        adapter_version=None,
        body={"id": response_id, "status": status, "output": [{"text": text}]},
        input_items=[{"id": "msg_1", "type": "message", "n": len(response_id)}],
        context=[],
    )


async def agreed(sessions: async_sessionmaker[AsyncSession], files: FileStore) -> dict[str, int]:
    """The totals, once checked against the rows and against what the cap reads."""
    kept = await totals(sessions)
    assert kept == await summed(sessions)
    for uid, size in kept.items():
        assert await files.storage_used(uid) == size
    return kept


async def test_the_totals_are_the_rows_sums_after_every_kind_of_write(
    sessions: async_sessionmaker[AsyncSession], admin: AdminService
) -> None:
    acme = await admin.create_tenant("test", schemas.TenantCreate(id="acme", name="ACME"))
    await admin.put_quota("test", "acme", schemas.TenantQuotaPut(storage_bytes=1_000_000))
    uids = [acme.uid, "uid-b", "uid-c"]
    files = FileStore(sessions, DAY, 1 << 30)
    replicas = [ResponseStore(sessions, 30 * DAY) for _ in range(2)]
    try:
        # Uploads at once, some past acme's cap; responses saved at once from two replicas,
        # several tenants' in each batch, one refused (an id already stored) among them.
        async def upload(tenant_id: str, uid: str, size: int) -> str | None:
            file_id = new_file_id()
            try:
                await files.add_within_cap(
                    tenant_id, uid, file_id, purpose="batch", filename="f", size=size
                )
            except StorageLimitError:
                return None
            return file_id

        await replicas[0].save(uids[1], response("resp_taken"))
        uploads = [upload("acme", acme.uid, 300_000) for _ in range(5)]
        uploads += [upload("b", "uid-b", 100 + n) for n in range(3)]
        saves = [
            replicas[n % 2].save(uids[n % 3], response(f"resp_{n}", text="x" * n))
            for n in range(40)
        ]
        saves.append(replicas[1].save(uids[2], response("resp_taken")))
        done = await asyncio.gather(*uploads, *saves, return_exceptions=True)
        uploaded = [file_id for file_id in done[: len(uploads)] if isinstance(file_id, str)]
        assert len(uploaded) == 3 + 3, "acme's cap takes three"
        assert done[len(uploads) : -1] == [None] * 40
        assert isinstance(done[-1], IntegrityError)
        await agreed(sessions, files)

        # A background response finished with a longer body; another's finish refused.
        await replicas[0].save(uids[2], response("resp_bg", status="in_progress"))
        ended = response("resp_bg", text="a longer answer than before").body
        assert await replicas[1].finish("resp_bg", ended, only_from=("in_progress",))
        assert not await replicas[1].finish("resp_bg", ended, only_from=("in_progress",))
        await agreed(sessions, files)

        # Deletes, of what is there and of what is not (or is another tenant's).
        assert await replicas[0].delete(uids[0], "resp_0")
        assert not await replicas[0].delete(uids[1], "resp_3")
        assert await files.delete(acme.uid, uploaded[0])
        assert not await files.delete("uid-b", uploaded[1])
        await agreed(sessions, files)

        # A batch's result files, recorded with its move (and not, where it did not move).
        batches = BatchStore(sessions)
        batch = await batches.create(batch_row("uid-c", "c", now()))
        output = files.row("uid-c", new_file_id(), purpose="batch_output", filename="o", size=77)
        assert not await batches.move(batch.id, "failed", only_from=("done",), files=[output])
        assert await batches.move(batch.id, "failed", only_from=("validating",), files=[output])
        await agreed(sessions, files)

        # Expiry: counted until purged, then not (purged in small batches, while saves run).
        async with sessions.begin() as session:
            old = now() - 31 * DAY
            await session.execute(
                update(StoredResponseRow)
                .where(StoredResponseRow.id.in_([f"resp_{n}" for n in range(1, 30)]))
                .values(created_at=old)
            )
            await session.execute(
                update(FileRow).where(FileRow.tenant_uid == "uid-b").values(expires_at=old)
            )
        before = await agreed(sessions, files)
        purged, *_ = await asyncio.gather(
            replicas[0].purge(batch=4),
            *(replicas[1].save(uids[n % 3], response(f"resp_late_{n}")) for n in range(10)),
        )
        assert purged == 29
        while expired := await files.expired(batch=2):
            await files.forget(expired)
        after = await agreed(sessions, files)
        assert "uid-b" in before and after != before

        # A tenant's deletion leaves its files and stored responses, counted until purged.
        await admin.delete_tenant("test", "acme")
        assert (await agreed(sessions, files))[acme.uid] == after[acme.uid]
    finally:
        for store in replicas:
            await store.close()


def migrate(connection: sa.Connection, revision: str, *, down: bool = False) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(config, revision)


async def test_migration_0015_fills_the_totals_from_the_rows_and_goes_back_down(
    database_url: str,
) -> None:
    stamp = now()
    files = sa.table(
        "files",
        *(sa.column(c) for c in ("id", "tenant_uid", "purpose", "filename", "bytes")),
        *(sa.column(c) for c in ("created_at", "expires_at")),
    )
    rows: list[dict[str, Any]] = [
        {"id": f"file-{n}", "tenant_uid": uid, "purpose": "batch", "filename": "f", "bytes": n}
        for n, uid in ((5, "uid-a"), (7, "uid-a"), (11, "uid-b"))
    ]
    responses = sa.table(
        "stored_responses",
        *(sa.column(c) for c in ("id", "tenant_uid", "model", "body", "size_bytes")),
        *(sa.column(c) for c in ("input_items", "context", "created_at")),
    )
    engine = create_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0014")
            await connection.execute(
                files.insert().values(created_at=stamp, expires_at=stamp), rows
            )
            await connection.execute(
                responses.insert().values(created_at=stamp),
                [
                    {
                        "id": f"resp_{n}",
                        "tenant_uid": uid,
                        "model": "m",
                        "body": "{}",
                        "input_items": "[]",
                        "context": "[]",
                        "size_bytes": n,
                    }
                    for n, uid in ((100, "uid-a"), (300, "uid-c"))
                ],
            )
            await connection.run_sync(migrate, "0015")
            filled = (await connection.execute(sa.text("SELECT * FROM storage_usage"))).all()
            assert sorted(map(tuple, filled)) == [("uid-a", 112), ("uid-b", 11), ("uid-c", 300)]
            await connection.run_sync(migrate, "0014", down=True)
            tables = await connection.run_sync(lambda c: sa.inspect(c).get_table_names())
            indexes = await connection.run_sync(
                lambda c: {i["name"] for i in sa.inspect(c).get_indexes("stored_responses")}
            )
            assert "storage_usage" not in tables and "ix_stored_responses_tenant" in indexes
    finally:
        await engine.dispose()
