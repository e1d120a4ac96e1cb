"""Upgrading a store in use (docs/upgrades.md), on every backend: a store migrated to each
earlier revision and filled with data in every table it has, then migrated to the newest as a
starting gateway migrates it, keeps every row and every value, gets what the newer revisions
derive from them, and serves: its registry loads, and the app answers on it.

A migration that adds a table or a column makes this test fail at its revision (once a newer
one follows it) until ROWS below fills it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection

from app.store.db import alembic_config, create_engine, open_database
from app.store.snapshot import load_registry
from app.store.tables import Base
from app.tenancy.keys import display_prefix, hash_key
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import ServeFactory

REVISIONS = [
    script.revision
    for script in reversed(list(ScriptDirectory.from_config(alembic_config()).walk_revisions()))
]
NEWEST = REVISIONS[-1]
EARLIER = REVISIONS[:-1]

DAY = datetime(2026, 3, 2, 9, 30, tzinfo=timezone.utc)
LATER = DAY + timedelta(hours=2)
KEY = "sk-lgw-upgrade-test-key-of-acme-0123456789abcdef"
REVOKED_KEY = "sk-lgw-upgrade-test-key-revoked-0123456789abcdef"
ACME_UID, BETA_UID = "a" * 32, "b" * 32
AUTO_IDS = {"adapter_versions", "audit_log", "usage"}
"""Tables whose integer id the store assigns: a row names itself by NATURAL_KEYS instead (an
id written by hand would leave PostgreSQL's sequence behind it)."""

ROWS: dict[str, list[dict[str, Any]]] = {
    "tenants": [
        {"id": "acme", "uid": ACME_UID, "cache_salt": "c" * 32, "name": "Acme",
         "allow_base_model": True, "enabled": True, "created_at": DAY, "weight": 3,
         "priority": "batch", "slo_ttft_ms": 500, "slo_tpot_ms": 50},
        {"id": "beta", "uid": BETA_UID, "cache_salt": "d" * 32, "name": "Beta",
         "allow_base_model": False, "enabled": False, "created_at": DAY, "weight": 1,
         "priority": "interactive", "slo_ttft_ms": 0, "slo_tpot_ms": 0},
    ],
    "api_keys": [
        {"id": "key_acme", "tenant_id": "acme", "sha256": hash_key(KEY),
         "prefix": display_prefix(KEY), "name": "prod", "created_at": DAY, "expires_at": None,
         "last_used_at": LATER, "revoked_at": None},
        {"id": "key_revoked", "tenant_id": "acme", "sha256": hash_key(REVOKED_KEY),
         "prefix": display_prefix(REVOKED_KEY), "name": "old", "created_at": DAY,
         "expires_at": LATER, "last_used_at": None, "revoked_at": LATER},
    ],
    "adapter_versions": [
        {"name": "support", "version": version, "sha256": f"{version}" * 64,
         "path": f"support/v{version}", "rank": 8, "target_modules": ["q_proj", "v_proj"],
         "size_bytes": 3_600_000 + version, "created_at": DAY, "unservable": None}
        for version in (1, 2)
    ],
    "grants": [
        {"tenant_id": "acme", "alias": "support", "adapter_name": "support", "version": 1,
         "weights": None, "sticky": False, "shadow": None, "rollback": None,
         "rolled_back": None, "created_at": DAY, "changed_at": DAY, "revision": 0},
        {"tenant_id": "acme", "alias": "split", "adapter_name": "support", "version": None,
         "weights": {"1": 90, "2": 10}, "sticky": True, "shadow": None,
         "rollback": {"to": 1, "error_rate": 0.2, "window_seconds": 300, "min_requests": 50},
         "rolled_back": {"to": 1, "at": DAY.isoformat(), "actor": "rollback-rule",
                         "reason": "errors", "replaced": "split"},
         "created_at": DAY, "changed_at": LATER, "revision": 2},
    ],
    "quotas": [
        {"tenant_id": "acme", "requests_per_minute": 600, "tokens_per_minute": 100_000,
         "max_concurrent_requests": 8, "token_budget": 5_000_000_000, "budget_period": "month",
         "updated_at": DAY, "storage_bytes": 1 << 30, "batch_tokens_enqueued": 10_000},
    ],
    "key_quotas": [
        {"key_id": "key_acme", "requests_per_minute": 60, "tokens_per_minute": None,
         "max_concurrent_requests": 2, "token_budget": None, "budget_period": None,
         "updated_at": DAY},
    ],
    "audit_log": [
        {"at": DAY, "actor": "cli", "action": "tenant.create", "target": "acme",
         "outcome": "ok", "detail": '{"name": "Acme"}'},
    ],
    "usage": [
        {"request_id": f"req-{status}", "tenant_id": "acme", "tenant_uid": ACME_UID,
         "key_id": "key_acme", "endpoint": "chat.completions", "model": "support",
         "adapter": "support", "adapter_version": 1, "user": "end-user-7",
         "prompt_tokens": 11, "completion_tokens": 5 if status == "ok" else 0,
         "status": status, "latency_ms": 120, "finish_reason": finish, "ttft_ms": 40,
         "itl_ms": 2.5, "shadow": False, "fault": None if status == "ok" else "version",
         "started_at": LATER, "finished_at": LATER + timedelta(seconds=1),
         "batch_id": "batch_upgrade" if status == "ok" else None}
        for status, finish in (("ok", "stop"), ("error", "error"))
    ],
    "version_minutes": [
        {"tenant_uid": ACME_UID, "model": "support", "adapter": "support",
         "adapter_version": 1, "minute": LATER, "finish_reason": finish, "requests": 1,
         "errors": errors}
        for finish, errors in (("stop", 0), ("error", 1))
    ],
    "refusals": [
        {"tenant_uid": ACME_UID, "minute": LATER, "limit": "requests", "tenant_id": "acme",
         "count": 4},
    ],
    "console_sessions": [
        {"id": "session-1", "actor": "admin:0123abcd", "admin_token_sha256": "e" * 64,
         "csrf_token": "f" * 64, "created_at": DAY, "expires_at": LATER, "ended_at": LATER,
         "ended_by": "sign-out"},
    ],
    "stored_responses": [
        {"id": "resp_upgrade", "tenant_uid": ACME_UID, "model": "support", "adapter": "support",
         "adapter_version": 1, "body": {"id": "resp_upgrade", "status": "completed"},
         "input_items": [{"type": "message", "role": "user", "content": "hi"}],
         "context": [{"role": "user", "content": "hi"}], "size_bytes": 200,
         "created_at": LATER, "status": "completed"},
    ],
    "files": [
        {"id": "file_upgrade", "tenant_uid": ACME_UID, "purpose": "batch",
         "filename": "in.jsonl", "bytes": 120, "created_at": DAY, "expires_at": LATER},
    ],
    "leases": [
        {"name": "batch:batch_upgrade", "holder": "replica-1", "expires_at": LATER},
    ],
    "batches": [
        {"id": "batch_upgrade", "tenant_uid": ACME_UID, "tenant_id": "acme",
         "key_id": "key_acme", "endpoint": "/v1/chat/completions",
         "input_file_id": "file_upgrade", "completion_window": "24h", "metadata": {"a": "b"},
         "status": "in_progress", "errors": None, "pins": {"support": [1]}, "total": 2,
         "completed": 1, "failed": 0, "output_file_id": None, "error_file_id": None,
         "created_at": DAY, "expires_at": LATER, "in_progress_at": DAY, "finalizing_at": None,
         "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
         "cancelled_at": None},
    ],
    "batch_lines": [
        {"batch_id": "batch_upgrade", "line": line, "custom_id": f"c{line}",
         "body": {"model": "support"}, "cost": 40, "status": status, "output": output}
        for line, status, output in ((1, "ok", {"id": "x"}), (2, "pending", None))
    ],
    "storage_usage": [
        {"tenant_uid": ACME_UID, "bytes": 200 + 120},  # its stored response and file above
    ],
}  # fmt: skip
NATURAL_KEYS = {
    "tenants": ("id",),
    "api_keys": ("id",),
    "adapter_versions": ("name", "version"),
    "grants": ("tenant_id", "alias"),
    "quotas": ("tenant_id",),
    "key_quotas": ("key_id",),
    "audit_log": ("action", "target"),
    "usage": ("request_id",),
    "version_minutes": ("tenant_uid", "adapter_version", "minute", "finish_reason"),
    "refusals": ("tenant_uid", "minute", "limit"),
    "console_sessions": ("id",),
    "stored_responses": ("id",),
    "files": ("id",),
    "leases": ("name",),
    "batches": ("id",),
    "batch_lines": ("batch_id", "line"),
    "storage_usage": ("tenant_uid",),
}
INSERT_ORDER = list(NATURAL_KEYS)
NOT_FILLED = {"alembic_version", "revision"}  # Alembic's own; the one counter 0001 inserts
REVISION_VALUE = 41


def migrate(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def columns_at(connection: Connection) -> dict[str, set[str]]:
    inspector = sa.inspect(connection)
    return {
        table: {column["name"] for column in inspector.get_columns(table)}
        for table in inspector.get_table_names()
        if table not in NOT_FILLED
    }


def fill(connection: Connection) -> dict[str, list[dict[str, Any]]]:
    """Every table this revision has, filled with ROWS cut to its columns; what was written.
    Fails where the revision has a table or a column that ROWS leaves empty."""
    present = columns_at(connection)
    assert set(present) <= set(ROWS), "a new table: add its rows to ROWS and NATURAL_KEYS"
    for table, columns in present.items():
        filled = set(ROWS[table][0]) | ({"id"} if table in AUTO_IDS else set())
        assert columns <= filled, f"{table}: fill {sorted(columns - filled)} in ROWS"
    metadata = sa.MetaData()
    written: dict[str, list[dict[str, Any]]] = {}
    for name in INSERT_ORDER:
        if name not in present:
            continue
        table = sa.Table(name, metadata, autoload_with=connection)
        rows = [{k: v for k, v in row.items() if k in present[name]} for row in ROWS[name]]
        connection.execute(table.insert(), rows)
        written[name] = rows
    revision = sa.table("revision", sa.column("id"), sa.column("value"))
    connection.execute(revision.update().where(revision.c.id == 1).values(value=REVISION_VALUE))
    return written


def read_all(connection: Connection) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, read with the newest schema's types."""
    return {
        name: [dict(row._mapping) for row in connection.execute(sa.select(table))]
        for name, table in Base.metadata.tables.items()
    }


def same(value: Any) -> Any:
    """A value as compared: datetimes as UTC (SQLite keeps them without their zone)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value
    return value


def by_key(table: str, rows: Iterable[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(same(row[c]) for c in NATURAL_KEYS[table]): row for row in rows}


async def upgrade_filled(url: str, revision: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The store at ``url`` migrated to ``revision`` and filled, then opened as a gateway opens
    it: what was written, and every row after."""
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate, revision)
        async with engine.begin() as connection:
            written = await connection.run_sync(fill)
    finally:
        await engine.dispose()
    async with open_database(url) as sessions:
        async with sessions() as session:
            after = await session.run_sync(lambda s: read_all(s.connection()))
            stamped = await session.scalar(sa.text("SELECT version_num FROM alembic_version"))
        _, registry = await load_registry(sessions, base_model_id="base")
    assert stamped == NEWEST
    return written, {"rows": after, "registry": registry}


def test_the_revisions_run_from_0001_to_the_newest_in_order() -> None:
    assert REVISIONS[0] == "0001"
    assert sorted(REVISIONS) == REVISIONS and len(set(REVISIONS)) == len(REVISIONS)


@pytest.mark.parametrize("revision", EARLIER)
async def test_an_earlier_store_upgrades_with_nothing_lost(
    database_url: str, revision: str
) -> None:
    written, found = await upgrade_filled(database_url, revision)
    rows = found["rows"]

    # Every row written is there, with every value written.
    for table, expected in written.items():
        present = by_key(table, rows[table])
        assert len(rows[table]) >= len(expected), table
        for row in expected:
            kept = present[tuple(same(row[c]) for c in NATURAL_KEYS[table])]
            assert {k: same(kept[k]) for k in row} == {k: same(v) for k, v in row.items()}, table

    # What the newer revisions derive from what was there.
    tenants = {row["id"]: row for row in rows["tenants"]}
    assert {row["id"] for row in rows["tenants"]} == {"acme", "beta"}
    uids = {tenant["uid"] for tenant in tenants.values()}
    salts = {tenant["cache_salt"] for tenant in tenants.values()}
    assert len(uids) == 2 and all(len(uid) == 32 for uid in uids)
    assert len(salts) == 2 and all(salts)
    acme_uid = tenants["acme"]["uid"]
    assert {row["tenant_uid"] for row in rows["usage"]} <= {acme_uid}
    assert [row["fault"] for row in rows["usage"] if row["status"] == "error"] == (
        ["version"] if "usage" in written else []
    )
    assert all(grant["changed_at"] is not None for grant in rows["grants"])
    counted = [m for m in rows["version_minutes"] if m["tenant_uid"] == acme_uid]
    ledger = [u for u in rows["usage"] if u["adapter"] == "support"]
    assert sum(m["requests"] for m in counted) == len(ledger)
    assert sum(m["errors"] for m in counted) == sum(u["status"] == "error" for u in ledger)
    assert rows["revision"] == [{"id": 1, "value": REVISION_VALUE}]
    # Responses stored before background ones were finished ones.
    assert {row["status"] for row in rows["stored_responses"]} <= {"completed"}
    # Each tenant's stored bytes: the sum of its files' and stored responses' sizes.
    stored = [(f["tenant_uid"], f["bytes"]) for f in rows["files"]] + [
        (r["tenant_uid"], r["size_bytes"]) for r in rows["stored_responses"]
    ]
    totals = {row["tenant_uid"]: row["bytes"] for row in rows["storage_usage"]}
    assert len(stored) == ("stored_responses" in written) + ("files" in written)
    assert totals == {uid: sum(size for u, size in stored if u == uid) for uid, _ in stored}

    # The in-memory view a gateway serves from, loaded from the result.
    registry = found["registry"]
    acme = registry.tenant("acme")
    assert acme is not None and acme.uid == acme_uid and acme.enabled
    assert acme.limits.requests_per_minute == 600
    assert set(acme.grants) == {"support", "split"}
    assert [w.adapter.version for w in acme.grants["split"].versions] == (
        [1, 2] if "weights" in written["grants"][0] else [2]  # before 0007: the latest version
    )
    assert registry.authenticate(KEY).tenant.id == "acme"
    beta = registry.tenant("beta")
    assert beta is not None and not beta.enabled


@pytest.mark.parametrize("revision", EARLIER[:1])  # every migration runs on it
async def test_the_app_serves_on_an_upgraded_store(
    serve: ServeFactory, database_url: str, revision: str
) -> None:
    await upgrade_filled(database_url, revision)
    async with serve(ScriptedEngine(), database_url=database_url) as served:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=served.base_url, headers=headers) as client:
            models = (await client.get("/v1/models")).json()
            chat = await client.post(
                "/v1/chat/completions",
                json={
                    "model": served.model,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 16,
                },
            )
            revoked = await client.get(
                "/v1/models", headers={"Authorization": f"Bearer {REVOKED_KEY}"}
            )
        assert {"support", "split"} <= {model["id"] for model in models["data"]}
        assert chat.status_code == 200, chat.text
        assert revoked.status_code == 401
        tenant = await served.admin("GET", "/tenants/acme")
        assert tenant["name"] == "Acme"
        quota = await served.admin("GET", "/tenants/acme/quota")
        assert quota["requests_per_minute"] == 600
        # The store takes new writes after the upgrade (the sequences behind the old rows).
        await served.admin("POST", "/tenants", {"id": "gamma", "name": "Gamma"})
        requests = [r.request_id for r in await served.usage_records()]
        assert len(requests) == len(set(requests)) >= 1


async def test_an_older_version_refuses_a_store_a_newer_one_migrated(tmp_path: Any) -> None:
    """What docs/upgrades.md says of rolling back the code alone: the store's revision is one
    the older code does not know, and it does not start."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    async with open_database(url):
        pass
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    finally:
        await engine.dispose()
    with pytest.raises(CommandError, match="9999"):
        async with open_database(url):
            pass
