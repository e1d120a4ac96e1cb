"""tenants: an internal id and a random prefix-cache salt; usage rows name the internal id

A tenant deleted and created again under the same id is another tenant: the uid tells their
usage rows (and quota state) apart, and the salt keeps the old one's cached prefixes from it.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import secrets
import uuid

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

tenants = sa.table(
    "tenants",
    sa.column("id", sa.String()),
    sa.column("uid", sa.String()),
    sa.column("cache_salt", sa.String()),
    sa.column("created_at", sa.DateTime(timezone=True)),
)
usage = sa.table(
    "usage",
    sa.column("tenant_id", sa.String()),
    sa.column("tenant_uid", sa.String()),
    sa.column("started_at", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    # Added in place with a placeholder default, then filled row by row: SQLite adds a NOT
    # NULL column only with a default, and a batch copy of `tenants` would cascade (foreign
    # keys are on) to every key, grant and quota.
    op.add_column(
        "tenants", sa.Column("uid", sa.String(length=32), nullable=False, server_default="")
    )
    op.add_column(
        "tenants",
        sa.Column("cache_salt", sa.String(length=64), nullable=False, server_default=""),
    )
    connection = op.get_bind()
    for (tenant_id,) in connection.execute(sa.select(tenants.c.id)).all():
        connection.execute(
            tenants.update()
            .where(tenants.c.id == tenant_id)
            .values(uid=uuid.uuid4().hex, cache_salt=secrets.token_hex(16))
        )
    if connection.dialect.name != "sqlite":
        # No placeholder left to give a tenant inserted without them (SQLite cannot drop a
        # default in place; the application always sets both).
        op.alter_column("tenants", "uid", server_default=None)
        op.alter_column("tenants", "cache_salt", server_default=None)
    op.create_index("ix_tenants_uid", "tenants", ["uid"], unique=True)

    op.add_column("usage", sa.Column("tenant_uid", sa.String(length=32), nullable=True))
    # A row is the tenant's of that id that existed when the request started; rows of a
    # tenant deleted since (even if its id is in use again) are left without one.
    owner = (
        sa.select(tenants.c.uid)
        .where(tenants.c.id == usage.c.tenant_id, tenants.c.created_at <= usage.c.started_at)
        .scalar_subquery()
    )
    connection.execute(usage.update().values(tenant_uid=owner))
    op.create_index("ix_usage_tenant_uid_started", "usage", ["tenant_uid", "started_at"])


def downgrade() -> None:
    # Not in batch mode (see 0005): SQLite >= 3.35 drops a column in place.
    op.drop_index("ix_usage_tenant_uid_started", table_name="usage")
    op.drop_column("usage", "tenant_uid")
    op.drop_index("ix_tenants_uid", table_name="tenants")
    op.drop_column("tenants", "cache_salt")
    op.drop_column("tenants", "uid")
