"""Migration 0006 on a store that has tenants and usage already, on every backend: each
tenant gets its own uid and a random cache salt, and each usage row the uid of the tenant
that made it, as far as the store can tell."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa
from alembic import command
from sqlalchemy import Connection

from app.store.db import alembic_config, create_engine
from app.store.tables import UTCDateTime

DAY = datetime(2026, 1, 10, tzinfo=timezone.utc)
tenants = sa.table(
    "tenants",
    sa.column("id", sa.String()),
    sa.column("name", sa.String()),
    sa.column("allow_base_model", sa.Boolean()),
    sa.column("enabled", sa.Boolean()),
    sa.column("created_at", UTCDateTime()),
)
usage = sa.table(
    "usage",
    sa.column("request_id", sa.String()),
    sa.column("tenant_id", sa.String()),
    sa.column("key_id", sa.String()),
    sa.column("endpoint", sa.String()),
    sa.column("model", sa.String()),
    sa.column("prompt_tokens", sa.Integer()),
    sa.column("completion_tokens", sa.Integer()),
    sa.column("status", sa.String()),
    sa.column("latency_ms", sa.Integer()),
    sa.column("started_at", UTCDateTime()),
    sa.column("finished_at", UTCDateTime()),
)


def migrate(connection: Connection, revision: str, *, down: bool = False) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(config, revision)


def usage_row(request_id: str, tenant_id: str, started_at: datetime) -> dict[str, object]:
    return {
        "request_id": request_id,
        "tenant_id": tenant_id,
        "key_id": "k",
        "endpoint": "chat.completions",
        "model": "base",
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "status": "ok",
        "latency_ms": 1,
        "started_at": started_at,
        "finished_at": started_at,
    }


def seed(connection: Connection) -> None:
    """acme, created on DAY after an earlier acme was deleted; beta; and usage of each, of
    the earlier acme and of a tenant no longer there."""
    for tenant_id in ("acme", "beta"):
        connection.execute(
            tenants.insert().values(
                id=tenant_id, name=tenant_id, allow_base_model=False, enabled=True, created_at=DAY
            )
        )
    after, before = DAY + timedelta(hours=1), DAY - timedelta(days=1)
    rows = [
        usage_row("acme-now", "acme", after),
        usage_row("acme-earlier", "acme", before),
        usage_row("beta-now", "beta", after),
        usage_row("gone", "gone", after),
    ]
    connection.execute(usage.insert(), rows)


async def test_existing_tenants_and_their_usage_get_uids(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, "0005")
            await connection.run_sync(seed)
            await connection.run_sync(migrate, "head")
            found = await connection.execute(sa.text("SELECT id, uid, cache_salt FROM tenants"))
            uids = {id_: (uid, salt) for id_, uid, salt in found}
            found = await connection.execute(sa.text("SELECT request_id, tenant_uid FROM usage"))
            owners = {request_id: uid for request_id, uid in found}
            # And back: 0006 goes down as it went up.
            await connection.run_sync(migrate, "0005", down=True)
            await connection.run_sync(migrate, "head")
    finally:
        await engine.dispose()

    (acme_uid, acme_salt), (beta_uid, beta_salt) = uids["acme"], uids["beta"]
    assert len({acme_uid, beta_uid}) == 2 and all(len(uid) == 32 for uid in (acme_uid, beta_uid))
    assert len({acme_salt, beta_salt}) == 2 and all(len(s) == 32 for s in (acme_salt, beta_salt))
    assert owners == {
        "acme-now": acme_uid,
        "acme-earlier": None,  # the earlier acme's: not the present one's
        "beta-now": beta_uid,
        "gone": None,
    }
