"""rollback judging: a grant's last change (when and how many), which its rollback rule judges
from and compares-and-sets on; whose doing each failed request was; each version's requests
and failures per alias and minute, and an index on one version's requests in time order

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("grants", sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("grants", sa.Column("revision", sa.Integer(), nullable=False, server_default="0"))
    # Existing grants are judged from the upgrade on: which of the requests before it were
    # served by the grant as it is now is not known.
    grants = sa.table("grants", sa.column("changed_at", sa.DateTime(timezone=True)))
    op.execute(grants.update().values(changed_at=datetime.now(timezone.utc)))
    op.add_column("usage", sa.Column("fault", sa.String(length=16), nullable=True))
    # Before this, every failure was counted against its version.
    usage = sa.table("usage", sa.column("status", sa.String()), sa.column("fault", sa.String()))
    op.execute(usage.update().where(usage.c.status == "error").values(fault="version"))
    op.create_index(
        "ix_usage_version_started",
        "usage",
        ["tenant_uid", "model", "adapter", "adapter_version", "started_at"],
    )
    op.create_table(
        "version_minutes",
        sa.Column("tenant_uid", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=100), nullable=False),
        sa.Column("adapter", sa.String(length=100), nullable=False),
        sa.Column("adapter_version", sa.Integer(), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finish_reason", sa.String(length=32), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_uid", "model", "adapter", "adapter_version", "minute", "finish_reason"
        ),
    )
    op.create_index(
        "ix_version_minutes_minute",
        "version_minutes",
        ["tenant_uid", "model", "adapter", "minute"],
    )
    # The requests already in the ledger, counted (SQLite keeps datetimes as text).
    minute = (
        "date_trunc('minute', started_at)"
        if op.get_bind().dialect.name == "postgresql"
        else "substr(started_at, 1, 16) || '\\:00.000000'"  # \\: is not a bind
    )
    op.execute(
        "INSERT INTO version_minutes (tenant_uid, model, adapter, adapter_version, minute, "
        "finish_reason, requests, errors) "
        f"SELECT tenant_uid, model, adapter, adapter_version, {minute}, "
        "coalesce(finish_reason, ''), count(*), "
        "sum(CASE WHEN fault = 'version' THEN 1 ELSE 0 END) FROM usage "
        "WHERE tenant_uid IS NOT NULL AND adapter IS NOT NULL AND adapter_version IS NOT NULL "
        f"GROUP BY tenant_uid, model, adapter, adapter_version, {minute}, "
        "coalesce(finish_reason, '')"
    )


def downgrade() -> None:
    op.drop_index("ix_version_minutes_minute", table_name="version_minutes")
    op.drop_table("version_minutes")
    op.drop_index("ix_usage_version_started", table_name="usage")
    op.drop_column("usage", "fault")
    op.drop_column("grants", "revision")
    op.drop_column("grants", "changed_at")
