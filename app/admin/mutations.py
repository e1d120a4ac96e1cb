"""Audited transactions: the plumbing every admin mutation shares.

A mutation runs in one transaction that also bumps the store's revision and appends an
audit record; a rejected mutation is audited on its own and changes nothing. After a commit
``on_change`` runs, so this replica's in-memory view is current before the response leaves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timezone

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.errors import BadRequestError, ConflictError, GatewayError, NotFoundError
from app.store.tables import AuditRow, RevisionRow, TenantRow
from app.tenancy.adapters import AdapterError

_AUDITED = "_lora_gateway_audited"


def now() -> datetime:
    return datetime.now(timezone.utc)


class Mutations:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], on_change: Callable[[], Awaitable[None]]
    ) -> None:
        self.sessions = sessions
        self._on_change = on_change

    @asynccontextmanager
    async def audited(
        self, actor: str, action: str, target: str, detail: str = ""
    ) -> AsyncIterator[AsyncSession]:
        """A transaction for ``actor``'s ``action`` on ``target``, audited whatever its end."""
        try:
            async with self.sessions.begin() as session:
                yield session
                await bump_revision(session)
                session.add(audit_record(actor, action, target, "ok", detail))
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
        await self.changed()

    async def audit(
        self, actor: str, action: str, target: str, outcome: str, detail: str = ""
    ) -> None:
        async with self.sessions.begin() as session:
            session.add(audit_record(actor, action, target, outcome, detail))

    async def changed(self) -> None:
        """Bring this replica's view up to a change just committed."""
        await self._on_change()


async def bump_revision(session: AsyncSession) -> None:
    """Tell every replica's registry that the store changed (it polls the revision)."""
    await session.execute(
        update(RevisionRow).where(RevisionRow.id == 1).values(value=RevisionRow.value + 1)
    )


async def find_tenant(session: AsyncSession, tenant_id: str) -> TenantRow:
    row = await session.get(TenantRow, tenant_id)
    if row is None:
        raise NotFoundError(f"No tenant `{tenant_id}`.")
    return row


def audit_record(actor: str, action: str, target: str, outcome: str, detail: str = "") -> AuditRow:
    return AuditRow(
        at=now(), actor=actor, action=action, target=target, outcome=outcome, detail=detail
    )


def mark_audited(error: GatewayError) -> GatewayError:
    """Note that ``error``'s rejection is already in the audit log (the HTTP layer,
    which audits the admin requests the service never saw, then leaves it alone)."""
    setattr(error, _AUDITED, True)
    return error


def was_audited(error: BaseException) -> bool:
    return bool(getattr(error, _AUDITED, False))
