"""Every admin mutation, audited, behind one class the REST API and the CLI share.

Each mutation runs in one transaction that also bumps the store's revision
and appends an audit record; a rejected mutation is audited on its own and
changes nothing. After a commit ``on_change`` runs, so this replica's
in-memory view is current before the response leaves.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin import queries, schemas
from app.admin.queries import AdapterSummary, AuditFilter, Page
from app.errors import BadRequestError, ConflictError, GatewayError, NotFoundError
from app.settings import Settings
from app.store.tables import (
    AdapterVersionRow,
    ApiKeyRow,
    AuditRow,
    GrantRow,
    KeyQuotaRow,
    QuotaRow,
    RevisionRow,
    TenantRow,
    as_utc,
)
from app.tenancy import keys
from app.tenancy.adapters import AdapterError
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.manifests import GrantSpec
from app.tenancy.storage import AdapterStore, open_adapter_store
from app.tenancy.validation import ValidatedAdapter

# Who the audit log says rolled a grant back when its rollback rule did.
ROLLBACK_RULE_ACTOR = "rollback-rule"
# Names whose /admin/v1/adapters/<name> is a route of its own.
RESERVED_ADAPTER_NAMES = frozenset({"residency"})


def now() -> datetime:
    return datetime.now(timezone.utc)


class AdminService:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        storage: AdapterStore,
        on_change: Callable[[], Awaitable[None]],
    ) -> None:
        self._sessions = sessions
        self.storage = storage
        self._on_change = on_change

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

    # -- plumbing ---------------------------------------------------------------

    @asynccontextmanager
    async def _mutation(
        self, actor: str, action: str, target: str, detail: str = ""
    ) -> AsyncIterator[AsyncSession]:
        try:
            async with self._sessions.begin() as session:
                yield session
                await session.execute(
                    update(RevisionRow)
                    .where(RevisionRow.id == 1)
                    .values(value=RevisionRow.value + 1)
                )
                session.add(_audit(actor, action, target, "ok", detail))
        except GatewayError as exc:
            await self.audit(actor, action, target, "rejected", exc.message)
            mark_audited(exc)
            raise
        except AdapterError as exc:
            await self.audit(actor, action, target, "rejected", str(exc))
            raise mark_audited(BadRequestError(str(exc))) from exc
        except IntegrityError as exc:
            await self.audit(actor, action, target, "rejected", "concurrent change")
            conflict = ConflictError(f"`{target}` was changed concurrently; retry.")
            raise mark_audited(conflict) from exc
        await self._on_change()

    async def audit(
        self, actor: str, action: str, target: str, outcome: str, detail: str = ""
    ) -> None:
        async with self._sessions.begin() as session:
            session.add(_audit(actor, action, target, outcome, detail))

    async def _tenant(self, session: AsyncSession, tenant_id: str) -> TenantRow:
        row = await session.get(TenantRow, tenant_id)
        if row is None:
            raise NotFoundError(f"No tenant `{tenant_id}`.")
        return row

    # -- tenants ----------------------------------------------------------------

    async def create_tenant(self, actor: str, body: schemas.TenantCreate) -> TenantRow:
        async with self._mutation(actor, "tenant.create", body.id) as session:
            if await session.get(TenantRow, body.id) is not None:
                raise ConflictError(f"Tenant `{body.id}` already exists.")
            row = TenantRow(
                id=body.id,
                name=body.name,
                allow_base_model=body.allow_base_model,
                enabled=True,
                weight=body.weight,
                priority=body.priority,
                created_at=now(),
            )
            session.add(row)
        return row

    async def list_tenants(self) -> list[TenantRow]:
        async with self._sessions() as session:
            return list(await session.scalars(select(TenantRow).order_by(TenantRow.id)))

    async def get_tenant(self, tenant_id: str) -> TenantRow:
        async with self._sessions() as session:
            return await self._tenant(session, tenant_id)

    async def update_tenant(
        self, actor: str, tenant_id: str, body: schemas.TenantUpdate
    ) -> TenantRow:
        async with self._mutation(actor, "tenant.update", tenant_id) as session:
            row = await self._tenant(session, tenant_id)
            for field, value in body.model_dump(exclude_none=True).items():
                setattr(row, field, value)
        return row

    async def delete_tenant(self, actor: str, tenant_id: str) -> None:
        async with self._mutation(actor, "tenant.delete", tenant_id) as session:
            await session.delete(await self._tenant(session, tenant_id))

    # -- keys -------------------------------------------------------------------

    async def create_key(
        self, actor: str, tenant_id: str, body: schemas.KeyCreate
    ) -> tuple[ApiKeyRow, str]:
        if body.expires_at is not None and as_utc(body.expires_at) <= now():
            raise BadRequestError("`expires_at` is in the past.", param="expires_at")
        key = keys.generate_key()
        async with self._mutation(actor, "key.create", tenant_id) as session:
            await self._tenant(session, tenant_id)
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
            await self._tenant(session, tenant_id)
            query = select(ApiKeyRow).where(ApiKeyRow.tenant_id == tenant_id)
            return list(await session.scalars(query.order_by(ApiKeyRow.created_at)))

    @staticmethod
    async def _key(session: AsyncSession, tenant_id: str, key_id: str) -> ApiKeyRow:
        row = await session.get(ApiKeyRow, key_id)
        if row is None or row.tenant_id != tenant_id:
            raise NotFoundError(f"No key `{key_id}` for tenant `{tenant_id}`.")
        return row

    async def revoke_key(self, actor: str, tenant_id: str, key_id: str) -> None:
        async with self._mutation(actor, "key.revoke", f"{tenant_id}/{key_id}") as session:
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
        async with self._mutation(actor, "adapter.register", name) as session:
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
        async with self._mutation(actor, "adapter.delete", name) as session:
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
        async with self._mutation(actor, "adapter.version.delete", f"{name}@v{version}") as session:
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

    # -- grants -----------------------------------------------------------------

    async def put_grant(self, actor: str, tenant_id: str, alias: str, body: GrantSpec) -> GrantRow:
        """Grant ``alias`` as ``body`` says (a version, the latest, or a split), replacing
        what it was and any rollback of it."""
        target = f"{tenant_id}/{alias}"
        async with self._mutation(actor, "grant.put", target, body.describe()) as session:
            await self._tenant(session, tenant_id)
            query = select(AdapterVersionRow.version).where(AdapterVersionRow.name == body.adapter)
            versions = set(await session.scalars(query))
            if not versions:
                raise NotFoundError(f"No adapter `{body.adapter}`.", param="adapter")
            named, field = (
                ([body.version], "version")
                if body.versions is None
                else (body.versions, "versions")
            )
            missing = sorted(v for v in named if v is not None and v not in versions)
            if missing:
                raise BadRequestError(
                    f"Adapter `{body.adapter}` has no version {', '.join(map(str, missing))}.",
                    param=field,
                )
            if body.shadow is not None and body.shadow.version not in versions:
                raise BadRequestError(
                    f"Adapter `{body.adapter}` has no version {body.shadow.version}.",
                    param="shadow.version",
                )
            row = await session.get(GrantRow, (tenant_id, alias))
            if row is None:
                row = GrantRow(tenant_id=tenant_id, alias=alias, created_at=now())
                session.add(row)
            row.adapter_name, row.version, row.sticky = (
                body.adapter,
                body.version,
                body.sticky == "user",
            )
            row.weights = (
                None if body.versions is None else {str(v): w for v, w in body.versions.items()}
            )
            row.shadow = body.shadow.model_dump() if body.shadow else None
            row.rollback = body.rollback.model_dump() if body.rollback else None
            row.rolled_back = None
        return row

    async def rollback_grant(
        self, actor: str, tenant_id: str, alias: str, version: int
    ) -> GrantRow:
        """All of ``alias``'s traffic to ``version`` of its adapter; what it replaces is kept
        in ``rolled_back`` (until the grant is put again)."""
        target = f"{tenant_id}/{alias}"
        async with self._mutation(actor, "grant.rollback", target, f"to v{version}") as session:
            row = await session.get(GrantRow, (tenant_id, alias))
            if row is None:
                raise NotFoundError(f"Tenant `{tenant_id}` has no model `{alias}`.")
            exists = select(AdapterVersionRow.id).where(
                AdapterVersionRow.name == row.adapter_name, AdapterVersionRow.version == version
            )
            if await session.scalar(exists) is None:
                raise BadRequestError(
                    f"Adapter `{row.adapter_name}` has no version {version}.", param="version"
                )
            row.rolled_back = _rolled_back(row, version, actor, "an admin's call")
            row.version, row.weights, row.shadow, row.rollback = version, None, None, None
        return row

    async def roll_back_by_rule(self, tenant_id: str, alias: str, reason: str) -> bool:
        """Roll ``alias`` back to its rule's version, unless its rule is gone (an admin put
        the grant meanwhile, or another replica rolled it back first). Replicas that find the
        same failing version at once race here: the conditional update lets one of them win,
        and only the winner bumps the revision and writes the audit record."""
        target = f"{tenant_id}/{alias}"
        async with self._sessions.begin() as session:
            row = await session.get(GrantRow, (tenant_id, alias))
            if row is None or row.rollback is None:
                return False
            to = int(row.rollback["to"])
            moved = await session.execute(
                update(GrantRow)
                .where(
                    GrantRow.tenant_id == tenant_id,
                    GrantRow.alias == alias,
                    GrantRow.rollback.is_not(None),
                )
                .values(
                    version=to,
                    weights=None,
                    shadow=None,
                    rollback=None,
                    rolled_back=_rolled_back(row, to, ROLLBACK_RULE_ACTOR, reason),
                )
                .execution_options(synchronize_session=False)
            )
            if moved.rowcount != 1:  # type: ignore[attr-defined]
                return False
            await session.execute(
                update(RevisionRow).where(RevisionRow.id == 1).values(value=RevisionRow.value + 1)
            )
            session.add(_audit(ROLLBACK_RULE_ACTOR, "grant.rollback", target, "ok", reason))
        await self._on_change()
        return True

    async def delete_grant(self, actor: str, tenant_id: str, alias: str) -> None:
        async with self._mutation(actor, "grant.delete", f"{tenant_id}/{alias}") as session:
            row = await session.get(GrantRow, (tenant_id, alias))
            if row is None:
                raise NotFoundError(f"Tenant `{tenant_id}` has no model `{alias}`.")
            await session.delete(row)

    async def list_grants(self, tenant_id: str) -> list[GrantRow]:
        async with self._sessions() as session:
            await self._tenant(session, tenant_id)
            query = select(GrantRow).where(GrantRow.tenant_id == tenant_id)
            return list(await session.scalars(query.order_by(GrantRow.alias)))

    # -- quotas -----------------------------------------------------------------

    async def put_quota(self, actor: str, tenant_id: str, body: schemas.QuotaPut) -> QuotaRow:
        _check_quota(body)
        async with self._mutation(actor, "quota.put", tenant_id) as session:
            await self._tenant(session, tenant_id)
            row = await session.get(QuotaRow, tenant_id) or QuotaRow(tenant_id=tenant_id)
            session.add(_set_quota(row, body))
        return row

    async def get_quota(self, tenant_id: str) -> QuotaRow | None:
        async with self._sessions() as session:
            await self._tenant(session, tenant_id)
            return await session.get(QuotaRow, tenant_id)

    async def put_key_quota(
        self, actor: str, tenant_id: str, key_id: str, body: schemas.QuotaPut
    ) -> KeyQuotaRow:
        _check_quota(body)
        async with self._mutation(actor, "key.quota.put", f"{tenant_id}/{key_id}") as session:
            await self._key(session, tenant_id, key_id)
            row = await session.get(KeyQuotaRow, key_id) or KeyQuotaRow(key_id=key_id)
            session.add(_set_quota(row, body))
        return row

    async def get_key_quota(self, tenant_id: str, key_id: str) -> KeyQuotaRow | None:
        async with self._sessions() as session:
            await self._key(session, tenant_id, key_id)
            return await session.get(KeyQuotaRow, key_id)

    async def delete_key_quota(self, actor: str, tenant_id: str, key_id: str) -> None:
        async with self._mutation(actor, "key.quota.delete", f"{tenant_id}/{key_id}") as session:
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


_AUDITED = "_lora_gateway_audited"


def _rolled_back(row: GrantRow, to: int, actor: str, reason: str) -> dict[str, Any]:
    """The grant's ``rolled_back`` record: what a rollback to ``to`` replaces."""
    return {
        "to": to,
        "at": now().isoformat(),
        "actor": actor,
        "reason": reason,
        "replaced": row.spec().describe(),
    }


def mark_audited(error: GatewayError) -> GatewayError:
    """Note that ``error``'s rejection is already in the audit log (the HTTP layer,
    which audits the admin requests the service never saw, then leaves it alone)."""
    setattr(error, _AUDITED, True)
    return error


def was_audited(error: BaseException) -> bool:
    return bool(getattr(error, _AUDITED, False))


def _audit(actor: str, action: str, target: str, outcome: str, detail: str = "") -> AuditRow:
    return AuditRow(
        at=now(), actor=actor, action=action, target=target, outcome=outcome, detail=detail
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
