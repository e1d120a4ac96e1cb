"""Migration 0009 on a store that has grants and usage already, on every backend: each failed
request is counted against its version (as before), every version's requests are counted
per minute, and each grant is judged from the upgrade on."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa
from alembic import command

from app.store.db import alembic_config, create_engine
from app.store.tables import UTCDateTime

MINUTE = datetime(2026, 1, 10, 12, 30, tzinfo=timezone.utc)


def migrate(connection: sa.Connection, revision: str, *, down: bool = False) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(config, revision)


def usage_row(request_id: str, started_at: datetime) -> dict[str, object]:
    return {
        "request_id": request_id,
        "tenant_id": "acme",
        "key_id": "k",
        "endpoint": "chat.completions",
        "model": "assist",
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "status": "ok",
        "latency_ms": 1,
        "started_at": started_at,
        "finished_at": started_at,
    }


tenants = sa.table(
    "tenants",
    *(
        sa.column(name)
        for name in ("id", "name", "allow_base_model", "enabled", "uid", "cache_salt")
    ),
    sa.column("created_at", UTCDateTime()),
)
usage = sa.table(
    "usage",
    *(sa.column(name) for name in usage_row("x", MINUTE)),
    sa.column("tenant_uid", sa.String()),
    sa.column("adapter", sa.String()),
    sa.column("adapter_version", sa.Integer()),
    sa.column("finish_reason", sa.String()),
)
grants = sa.table(
    "grants",
    sa.column("tenant_id", sa.String()),
    sa.column("alias", sa.String()),
    sa.column("adapter_name", sa.String()),
    sa.column("created_at", UTCDateTime()),
)


def seed(connection: sa.Connection) -> None:
    connection.execute(
        tenants.insert().values(
            id="acme",
            name="acme",
            allow_base_model=False,
            enabled=True,
            created_at=MINUTE,
            uid="u",
            cache_salt="s",
        )
    )
    connection.execute(
        grants.insert().values(
            tenant_id="acme", alias="assist", adapter_name="support", created_at=MINUTE
        )
    )
    served = {"tenant_uid": "u", "adapter": "support", "adapter_version": 2}
    rows = [
        usage_row("a", MINUTE + timedelta(seconds=5))
        | served
        | {"status": "error", "finish_reason": None},
        usage_row("b", MINUTE + timedelta(seconds=59)) | served | {"finish_reason": None},
        usage_row("c", MINUTE + timedelta(seconds=60)) | served | {"finish_reason": "stop"},
        usage_row("base", MINUTE) | {"finish_reason": None},
    ]
    for row in rows:
        row.setdefault("tenant_uid", "u")
        row.setdefault("adapter", None)
        row.setdefault("adapter_version", None)
    connection.execute(usage.insert(), rows)


async def test_the_ledger_is_counted_and_grants_are_judged_from_the_upgrade(
    database_url: str,
) -> None:
    engine = create_engine(database_url)
    before = datetime.now(timezone.utc)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0008")
            await connection.run_sync(seed)
            await connection.run_sync(migrate, "head")
            found = await connection.execute(
                sa.text(
                    "SELECT adapter_version, minute, finish_reason, requests, errors "
                    "FROM version_minutes ORDER BY minute"
                )
            )
            counts = [(v, str(m)[11:16], reason, n, e) for v, m, reason, n, e in found]
            found = await connection.execute(sa.text("SELECT request_id, fault FROM usage"))
            faults = dict(found.all())
            changed_at = sa.table("grants", sa.column("changed_at", UTCDateTime()))
            changed, revision = (
                await connection.execute(
                    sa.select(changed_at.c.changed_at, sa.text("revision")).select_from(changed_at)
                )
            ).one()
            # And back: 0009 goes down as it went up.
            await connection.run_sync(migrate, "0008", down=True)
            await connection.run_sync(migrate, "head")
    finally:
        await engine.dispose()

    assert counts == [(2, "12:30", "", 2, 1), (2, "12:31", "stop", 1, 0)]
    assert faults == {"a": "version", "b": None, "c": None, "base": None}
    assert changed >= before and revision == 0
