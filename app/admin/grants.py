"""A tenant's aliases: granted as one version, the latest, or a weighted split, rolled back by
an admin or by the alias's own rule (docs/rollouts.md); every change audited."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from app.admin.mutations import Mutations, audit_record, bump_revision, find_tenant, now
from app.errors import BadRequestError, NotFoundError
from app.store.tables import AdapterVersionRow, GrantRow
from app.tenancy.manifests import GrantSpec

# Who the audit log says rolled a grant back when its rollback rule did.
ROLLBACK_RULE_ACTOR = "rollback-rule"


class Grants:
    def __init__(self, mutations: Mutations) -> None:
        self._mutations = mutations

    async def put(self, actor: str, tenant_id: str, alias: str, body: GrantSpec) -> GrantRow:
        """Grant ``alias`` as ``body`` says (a version, the latest, or a split), replacing
        what it was and any rollback of it."""
        target = f"{tenant_id}/{alias}"
        async with self._mutations.audited(actor, "grant.put", target, body.describe()) as session:
            await find_tenant(session, tenant_id)
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
            _changed(row)
        return row

    async def roll_back(self, actor: str, tenant_id: str, alias: str, version: int) -> GrantRow:
        """All of ``alias``'s traffic to ``version`` of its adapter; what it replaces is kept
        in ``rolled_back`` (until the grant is put again)."""
        target = f"{tenant_id}/{alias}"
        async with self._mutations.audited(
            actor, "grant.rollback", target, f"to v{version}"
        ) as session:
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
            _changed(row)
        return row

    async def roll_back_by_rule(
        self, tenant_id: str, alias: str, reason: str, *, judged: int
    ) -> bool:
        """Roll ``alias`` back to its rule's version, if the grant is still the one the rule
        judged (its revision ``judged``): not when an admin put it meanwhile (the grant in
        place has not been judged yet, whatever it serves), nor when another replica rolled
        it back first. Replicas that find the same failing version at once race here: the
        update, conditional on the revision, lets one of them win, and only the winner bumps
        the store's revision and writes the audit record."""
        target = f"{tenant_id}/{alias}"
        async with self._mutations.sessions.begin() as session:
            row = await session.get(GrantRow, (tenant_id, alias))
            if row is None or row.rollback is None or row.revision != judged:
                return False
            to = int(row.rollback["to"])
            moved = await session.execute(
                update(GrantRow)
                .where(
                    GrantRow.tenant_id == tenant_id,
                    GrantRow.alias == alias,
                    GrantRow.revision == judged,
                    GrantRow.rollback.is_not(None),
                )
                .values(
                    version=to,
                    weights=None,
                    shadow=None,
                    rollback=None,
                    rolled_back=_rolled_back(row, to, ROLLBACK_RULE_ACTOR, reason),
                    changed_at=now(),
                    revision=GrantRow.revision + 1,
                )
                .execution_options(synchronize_session=False)
            )
            if moved.rowcount != 1:  # type: ignore[attr-defined]
                return False
            await bump_revision(session)
            session.add(audit_record(ROLLBACK_RULE_ACTOR, "grant.rollback", target, "ok", reason))
        await self._mutations.changed()
        return True

    async def delete(self, actor: str, tenant_id: str, alias: str) -> None:
        async with self._mutations.audited(
            actor, "grant.delete", f"{tenant_id}/{alias}"
        ) as session:
            row = await session.get(GrantRow, (tenant_id, alias))
            if row is None:
                raise NotFoundError(f"Tenant `{tenant_id}` has no model `{alias}`.")
            await session.delete(row)

    async def for_tenant(self, tenant_id: str) -> list[GrantRow]:
        async with self._mutations.sessions() as session:
            await find_tenant(session, tenant_id)
            query = select(GrantRow).where(GrantRow.tenant_id == tenant_id)
            return list(await session.scalars(query.order_by(GrantRow.alias)))


def _changed(row: GrantRow) -> None:
    """Mark ``row`` changed now: a rule judges it afresh, and no rollback judged before
    applies to it."""
    row.changed_at = now()
    row.revision = (row.revision or 0) + 1


def _rolled_back(row: GrantRow, to: int, actor: str, reason: str) -> dict[str, Any]:
    """The grant's ``rolled_back`` record: what a rollback to ``to`` replaces."""
    return {
        "to": to,
        "at": now().isoformat(),
        "actor": actor,
        "reason": reason,
        "replaced": row.spec().describe(),
    }
