"""The store's content as one immutable in-memory view, rebuilt on every change.

Requests read only the view, never the database; a replica learns of changes
made elsewhere by polling the store's revision counter.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.quota.limits import Limits
from app.store.changes import StoreVersion, polled
from app.store.tables import (
    AdapterVersionRow,
    ApiKeyRow,
    GrantRow,
    KeyQuotaRow,
    QuotaRow,
    RevisionRow,
    TenantRow,
)
from app.tenancy.adapters import Adapter
from app.tenancy.grants import Grant, RollbackRule, Shadow, Weighted
from app.tenancy.registry import TenantRegistry
from app.tenancy.tenants import ApiKey, Tenant


def adapter_of(row: AdapterVersionRow) -> Adapter:
    return Adapter(
        name=row.name,
        version=row.version,
        sha256=row.sha256,
        path=Path(row.path),
        rank=row.rank,
        target_modules=tuple(row.target_modules),
        # The row id is unique per version across the whole store (and so
        # across replicas): vLLM's cache key for the adapter's weights.
        lora_id=row.id,
        unservable=row.unservable,
    )


def grant_of(row: GrantRow, available: dict[int, Adapter]) -> Grant | None:
    """The grant ``row`` makes of the adapter's ``available`` versions; None where none of
    the versions it names (with a weight above 0) exists."""
    served = _served(row, available)
    shadow = row.shadow
    if served is None or shadow is None or shadow["version"] not in available:
        return served
    return replace(served, shadow=Shadow(available[shadow["version"]], shadow["percent"]))


def _served(row: GrantRow, available: dict[int, Adapter]) -> Grant | None:
    if row.weights:
        split = [
            Weighted(available[int(version)], weight)
            for version, weight in row.weights.items()
            if int(version) in available
        ]
        if not any(w.weight for w in split):
            return None
        rule = RollbackRule(**row.rollback) if row.rollback else None
        versions = tuple(sorted(split, key=lambda w: w.adapter.version))
        return Grant(
            versions,
            sticky=row.sticky,
            rollback=rule,
            changed_at=row.changed_at,
            revision=row.revision,
        )
    chosen = row.version if row.version is not None else max(available, default=None)
    return Grant.of(available[chosen]) if chosen in available else None


REVISION = select(RevisionRow.value).where(RevisionRow.id == 1)


async def revision(
    sessions: async_sessionmaker[AsyncSession], version: StoreVersion | None = None
) -> int:
    """The registry's revision, for a poll (:func:`app.store.changes.polled`)."""
    values = await polled(sessions, version, REVISION)
    return int(values[0] or 0) if values else 0


async def load_registry(
    sessions: async_sessionmaker[AsyncSession], *, base_model_id: str
) -> tuple[int, TenantRegistry]:
    """The current revision and the registry built from it, read in one transaction."""
    async with sessions() as session, session.begin():
        current = await session.scalar(select(RevisionRow.value).where(RevisionRow.id == 1))
        tenant_rows = list(await session.scalars(select(TenantRow)))
        key_rows = list(
            await session.scalars(select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None)))
        )
        version_rows = list(await session.scalars(select(AdapterVersionRow)))
        grant_rows = list(await session.scalars(select(GrantRow)))
        quotas = {
            row.tenant_id: Limits.from_quota(row) for row in await session.scalars(select(QuotaRow))
        }
        key_quotas = {
            row.key_id: Limits.from_quota(row) for row in await session.scalars(select(KeyQuotaRow))
        }

    versions: dict[str, dict[int, Adapter]] = defaultdict(dict)
    for row in version_rows:
        versions[row.name][row.version] = adapter_of(row)
    grants: dict[str, dict[str, Grant]] = defaultdict(dict)
    for grant_row in grant_rows:
        grant = grant_of(grant_row, versions.get(grant_row.adapter_name, {}))
        if grant is not None:
            grants[grant_row.tenant_id][grant_row.alias] = grant
    tenants = [
        Tenant(
            id=row.id,
            name=row.name,
            allow_base_model=row.allow_base_model,
            enabled=row.enabled,
            grants=grants[row.id],
            limits=quotas.get(row.id, Limits()),
            weight=row.weight,
            priority="batch" if row.priority == "batch" else "interactive",
            slo_ttft_ms=row.slo_ttft_ms,
            slo_tpot_ms=row.slo_tpot_ms,
            uid=row.uid,
            cache_salt=row.cache_salt,
        )
        for row in tenant_rows
    ]
    keys = [
        ApiKey(
            id=row.id,
            tenant_id=row.tenant_id,
            sha256=row.sha256,
            prefix=row.prefix,
            name=row.name,
            expires_at=row.expires_at,
            limits=key_quotas.get(row.id, Limits()),
        )
        for row in key_rows
    ]
    return int(current or 0), TenantRegistry(tenants, keys, base_model_id=base_model_id)
