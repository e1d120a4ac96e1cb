"""Leases in the shared store: a named piece of work (a batch, a background response)
that one holder does at a time, whichever replica it runs on.

A holder takes a lease for a while and renews it (:meth:`Leases.take` again, well before it
expires) for as long as it works; it releases it when done. A holder that dies stops
renewing: once the lease has expired, another holder takes it over. Taking is one
conditional write, so two holders never both believe they hold a lease: a holder that finds
it cannot renew (:meth:`Leases.take` answers False) must stop the work.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.tables import LeaseRow


def new_holder_id() -> str:
    """A holder id naming this process, unique among every replica's."""
    return f"{socket.gethostname()[:30]}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


class Leases:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], holder: str) -> None:
        self._sessions = sessions
        self.holder = holder

    async def take(self, name: str, duration: timedelta) -> bool:
        """Hold ``name`` for ``duration`` from now: taken where it is free, expired or already
        this holder's (a renewal). Whether this holder holds it now."""
        now = datetime.now(timezone.utc)
        until = now + duration
        taken = (
            update(LeaseRow)
            .where(
                LeaseRow.name == name,
                or_(LeaseRow.holder == self.holder, LeaseRow.expires_at <= now),
            )
            .values(holder=self.holder, expires_at=until)
        )
        async with self._sessions.begin() as session:
            if (await session.execute(taken)).rowcount:  # type: ignore[attr-defined]
                return True
        try:
            async with self._sessions.begin() as session:
                await session.execute(
                    insert(LeaseRow).values(name=name, holder=self.holder, expires_at=until)
                )
        except IntegrityError:  # another holder has it
            return False
        return True

    async def release(self, name: str) -> None:
        """Let ``name`` go, if this holder has it."""
        async with self._sessions.begin() as session:
            await session.execute(
                delete(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == self.holder)
            )

    async def expired(self, prefix: str) -> list[str]:
        """The names starting with ``prefix`` whose lease has expired: work whose holder
        stopped renewing it (died) without letting it go."""
        now = datetime.now(timezone.utc)
        query = select(LeaseRow.name).where(
            LeaseRow.name.startswith(prefix, autoescape=True), LeaseRow.expires_at <= now
        )
        async with self._sessions() as session:
            return list((await session.scalars(query)).all())
