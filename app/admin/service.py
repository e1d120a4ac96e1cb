"""Every admin mutation, audited (app/admin/mutations.py), behind one class the REST API, the
console and the CLI share; a tenant's aliases in app/admin/grants.py (``AdminService.grants``).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin import queries, schemas
from app.admin.grants import Grants
from app.admin.mutations import Mutations, find_tenant, now
from app.admin.queries import AdapterSummary, AuditFilter, Page
from app.errors import BadRequestError, ConflictError, NotFoundError
from app.settings import Settings
from app.store.tables import (
    AdapterVersionRow,
    ApiKeyRow,
    AuditRow,
    GrantRow,
    KeyQuotaRow,
    QuotaRow,
    TenantRow,
    as_utc,
)
from app.tenancy import keys
from app.tenancy.adapters import Adapter
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.storage import AdapterStore, open_adapter_store
from app.tenancy.validation import ValidatedAdapter

# Names whose /admin/v1/adapters/<name> is a route of its own.
RESERVED_ADAPTER_NAMES = frozenset({"residency"})


class AdminService:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        storage: AdapterStore,
        on_change: Callable[[], Awaitable[None]],
    ) -> None:
        self._sessions = sessions
        self._mutations = Mutations(sessions, on_change)
        self.storage = storage
        self.grants = Grants(self._mutations)
        self.audit = self._mutations.audit

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        sessions: async_sessionmaker[AsyncSession],
        base_model: BaseModelInfo,
        on_change: Callable[[], Awaitable[None]],
    ) -> AdminService:
        """The admin service the gateway and the CLI both use."""
        return cls(sessions, open_adapter_store(settings, base_model), on_change)

    # -- tenants ----------------------------------------------------------------

    async def create_tenant(self, actor: str, body: schemas.TenantCreate) -> TenantRow:
        async with self._mutations.audited(actor, "tenant.create", body.id) as session:
            if await session.get(TenantRow, body.id) is not None:
                raise ConflictError(f"Tenant `{body.id}` already exists.")
            row = TenantRow(
                id=body.id,
                name=body.name,
                allow_base_model=body.allow_base_model,
                enabled=True,
                weight=body.weight,
                priority=body.priority,
                slo_ttft_ms=body.slo_ttft_ms,
                slo_tpot_ms=body.slo_tpot_ms,
                created_at=now(),
            )
            session.add(row)
        return row

    async def list_tenants(self) -> list[TenantRow]:
        async with self._sessions() as session:
            return list(await session.scalars(select(TenantRow).order_by(TenantRow.id)))

    async def get_tenant(self, tenant_id: str) -> TenantRow:
        async with self._sessions() as session:
            return await find_tenant(session, tenant_id)

    async def update_tenant(
        self, actor: str, tenant_id: str, body: schemas.TenantUpdate
    ) -> TenantRow:
        async with self._mutations.audited(actor, "tenant.update", tenant_id) as session:
            row = await find_tenant(session, tenant_id)
            for field, value in body.model_dump(exclude_none=True).items():
                setattr(row, field, value)
        return row

    async def delete_tenant(self, actor: str, tenant_id: str) -> None:
        async with self._mutations.audited(actor, "tenant.delete", tenant_id) as session:
            await session.delete(await find_tenant(session, tenant_id))

    # -- keys -------------------------------------------------------------------

    async def create_key(
        self, actor: str, tenant_id: str, body: schemas.KeyCreate
    ) -> tuple[ApiKeyRow, str]:
        if body.expires_at is not None and as_utc(body.expires_at) <= now():
            raise BadRequestError("`expires_at` is in the past.", param="expires_at")
        key = keys.generate_key()
        async with self._mutations.audited(actor, "key.create", tenant_id) as session:
            await find_tenant(session, tenant_id)
            row = ApiKeyRow(
                id=keys.new_key_id(),
                tenant_id=tenant_id,
                sha256=keys.hash_key(key),
                prefix=keys.display_prefix(key),
                name=body.name,
                created_at=now(),
                expires_at=body.expires_at,
            )
            session.add(row)
        return row, key

    async def list_keys(self, tenant_id: str) -> list[ApiKeyRow]:
        async with self._sessions() as session:
            await find_tenant(session, tenant_id)
            query = select(ApiKeyRow).where(ApiKeyRow.tenant_id == tenant_id)
            return list(await session.scalars(query.order_by(ApiKeyRow.created_at)))

    @staticmethod
    async def _key(session: AsyncSession, tenant_id: str, key_id: str) -> ApiKeyRow:
        row = await session.get(ApiKeyRow, key_id)
        if row is None or row.tenant_id != tenant_id:
            raise NotFoundError(f"No key `{key_id}` for tenant `{tenant_id}`.")
        return row

    async def revoke_key(self, actor: str, tenant_id: str, key_id: str) -> None:
        async with self._mutations.audited(actor, "key.revoke", f"{tenant_id}/{key_id}") as session:
            row = await self._key(session, tenant_id, key_id)
            row.revoked_at = row.revoked_at or now()

    async def touch_keys(self, key_ids: Iterable[str], at: datetime) -> None:
        """Record use off the hot path; not an admin mutation, so not audited."""
        ids = list(key_ids)
        if ids:
            async with self._sessions.begin() as session:
                await session.execute(
                    update(ApiKeyRow).where(ApiKeyRow.id.in_(ids)).values(last_used_at=at)
                )

    # -- adapters ---------------------------------------------------------------

    async def register_adapter(
        self, actor: str, name: str, store: Callable[[], tuple[ValidatedAdapter, Path]]
    ) -> AdapterVersionRow:
        """Store (``store`` validates and copies, in a thread), record a version, then
        publish it to the storage (hosts without the database find versions there).

        Registering the content of the latest version again returns it unchanged (and
        publishes it again, should publishing have failed the first time).
        """
        async with self._mutations.audited(actor, "adapter.register", name) as session:
            if name in RESERVED_ADAPTER_NAMES:
                raise BadRequestError(
                    f"`{name}` is reserved: /admin/v1/adapters/{name} is another route.",
                    param="name",
                )
            checked, path = await asyncio.to_thread(store)
            latest = await self._latest(session, name)
            if latest is not None and latest.sha256 == checked.sha256:
                row = latest
            else:
                row = self._new_version(name, latest, checked, path)
                session.add(row)
        # Only after the commit: a registration that lost a race for the version number
        # must not name its content as that version.
        await asyncio.to_thread(self.storage.publish, row.name, row.version, row.sha256)
        return row

    @staticmethod
    def _new_version(
        name: str, latest: AdapterVersionRow | None, checked: ValidatedAdapter, path: Path
    ) -> AdapterVersionRow:
        return AdapterVersionRow(
            name=name,
            version=(latest.version + 1) if latest else 1,
            sha256=checked.sha256,
            path=str(path.resolve()),
            rank=checked.rank,
            target_modules=list(checked.target_modules),
            size_bytes=checked.size_bytes,
            created_at=now(),
        )

    @staticmethod
    async def _latest(session: AsyncSession, name: str) -> AdapterVersionRow | None:
        query = select(AdapterVersionRow).where(AdapterVersionRow.name == name)
        result = await session.scalars(query.order_by(AdapterVersionRow.version.desc()).limit(1))
        return result.first()

    async def adapter_unservable(self, adapter: Adapter, reason: str) -> None:
        """Mark ``adapter``'s version unservable (it failed to load in the engine), audited as
        the ``engine``'s: every replica refuses it from then on, before its engine
        (app/serving/lifecycle/tracking.py). Deleting the version clears it."""
        target = f"{adapter.name}@v{adapter.version}"
        async with self._mutations.audited("engine", "adapter.unservable", target, reason) as s:
            await s.execute(
                update(AdapterVersionRow)
                .where(AdapterVersionRow.id == adapter.lora_id)
                .values(unservable=reason)
            )

    async def list_adapter_versions(self, name: str | None = None) -> list[AdapterVersionRow]:
        query = select(AdapterVersionRow).order_by(
            AdapterVersionRow.name, AdapterVersionRow.version
        )
        if name is not None:
            query = query.where(AdapterVersionRow.name == name)
        async with self._sessions() as session:
            rows = list(await session.scalars(query))
        if name is not None and not rows:
            raise NotFoundError(f"No adapter `{name}`.")
        return rows

    async def delete_adapter(self, actor: str, name: str, force: bool) -> list[AdapterVersionRow]:
        """Remove every version (and, with ``force``, its grants); returns what was removed."""
        async with self._mutations.audited(actor, "adapter.delete", name) as session:
            query = select(AdapterVersionRow).where(AdapterVersionRow.name == name)
            versions = list(await session.scalars(query))
            if not versions:
                raise NotFoundError(f"No adapter `{name}`.")
            grants = list(
                await session.scalars(select(GrantRow).where(GrantRow.adapter_name == name))
            )
            if grants and not force:
                holders = ", ".join(sorted({f"{g.tenant_id}:{g.alias}" for g in grants}))
                raise ConflictError(
                    f"Adapter `{name}` is granted ({holders}); revoke the grants or pass "
                    "`force=true`."
                )
            await session.execute(delete(GrantRow).where(GrantRow.adapter_name == name))
            await session.execute(delete(AdapterVersionRow).where(AdapterVersionRow.name == name))
        return versions

    async def delete_adapter_version(
        self, actor: str, name: str, version: int
    ) -> AdapterVersionRow:
        """Remove one version; refused (409, naming the aliases) while a grant pins it, has
        it in a split or as its shadow, or follows the latest with no other version to fall
        back on."""
        async with self._mutations.audited(
            actor, "adapter.version.delete", f"{name}@v{version}"
        ) as session:
            rows = {
                row.version: row
                for row in await session.scalars(
                    select(AdapterVersionRow).where(AdapterVersionRow.name == name)
                )
            }
            row = rows.get(version)
            if row is None:
                raise NotFoundError(f"Adapter `{name}` has no version {version}.")
            grants = await session.scalars(select(GrantRow).where(GrantRow.adapter_name == name))
            holders = sorted(
                f"{g.tenant_id}:{g.alias}"
                for g in grants
                if g.version == version
                or str(version) in (g.weights or {})
                or (g.shadow or {}).get("version") == version
                or (g.version is None and not g.weights and len(rows) == 1)
            )
            if holders:
                raise ConflictError(
                    f"Version {version} of adapter `{name}` is granted ({', '.join(holders)}); "
                    "move those aliases to another version first."
                )
            await session.delete(row)
        return row

    async def forget_files(self, removed: Iterable[AdapterVersionRow]) -> None:
        """Delete stored content no remaining version refers to."""
        async with self._sessions() as session:
            for row in removed:
                query = select(func.count()).where(AdapterVersionRow.sha256 == row.sha256)
                if not await session.scalar(query):
                    await asyncio.to_thread(shutil.rmtree, row.path, True)

    # -- quotas -----------------------------------------------------------------

    async def put_quota(self, actor: str, tenant_id: str, body: schemas.QuotaPut) -> QuotaRow:
        _check_quota(body)
        async with self._mutations.audited(actor, "quota.put", tenant_id) as session:
            await find_tenant(session, tenant_id)
            row = await session.get(QuotaRow, tenant_id) or QuotaRow(tenant_id=tenant_id)
            session.add(_set_quota(row, body))
        return row

    async def get_quota(self, tenant_id: str) -> QuotaRow | None:
        async with self._sessions() as session:
            await find_tenant(session, tenant_id)
            return await session.get(QuotaRow, tenant_id)

    async def put_key_quota(
        self, actor: str, tenant_id: str, key_id: str, body: schemas.QuotaPut
    ) -> KeyQuotaRow:
        _check_quota(body)
        async with self._mutations.audited(
            actor, "key.quota.put", f"{tenant_id}/{key_id}"
        ) as session:
            await self._key(session, tenant_id, key_id)
            row = await session.get(KeyQuotaRow, key_id) or KeyQuotaRow(key_id=key_id)
            session.add(_set_quota(row, body))
        return row

    async def get_key_quota(self, tenant_id: str, key_id: str) -> KeyQuotaRow | None:
        async with self._sessions() as session:
            await self._key(session, tenant_id, key_id)
            return await session.get(KeyQuotaRow, key_id)

    async def delete_key_quota(self, actor: str, tenant_id: str, key_id: str) -> None:
        async with self._mutations.audited(
            actor, "key.quota.delete", f"{tenant_id}/{key_id}"
        ) as session:
            await self._key(session, tenant_id, key_id)
            row = await session.get(KeyQuotaRow, key_id)
            if row is not None:
                await session.delete(row)

    # -- listings (app/admin/queries.py) ------------------------------------------

    async def tenants_page(
        self, search: str = "", offset: int = 0, limit: int | None = 50
    ) -> Page[TenantRow]:
        return await queries.tenants_page(self._sessions, search=search, offset=offset, limit=limit)

    async def adapters_page(
        self, search: str = "", offset: int = 0, limit: int | None = 50
    ) -> Page[AdapterSummary]:
        return await queries.adapters_page(
            self._sessions, search=search, offset=offset, limit=limit
        )

    async def audit_page(
        self, where: AuditFilter | None = None, offset: int = 0, limit: int = 100
    ) -> Page[AuditRow]:
        return await queries.audit_page(
            self._sessions, where or AuditFilter(), offset=offset, limit=limit
        )


Quota = TypeVar("Quota", QuotaRow, KeyQuotaRow)


def _check_quota(body: schemas.QuotaPut) -> None:
    if body.token_budget is not None and body.budget_period is None:
        raise BadRequestError("`token_budget` needs a `budget_period`.", param="budget_period")


def _set_quota(row: Quota, body: schemas.QuotaPut) -> Quota:
    for field, value in body.model_dump().items():
        setattr(row, field, value)
    row.updated_at = now()
    return row
