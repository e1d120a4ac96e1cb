"""Admin console sessions: an admin token exchanged for a session kept in the store.

A session is valid on every replica until it expires, is signed out, or the admin token it was
made from is no longer accepted by the replica it reaches (that replica then ends it in the
store, so it ends everywhere). Each console request reads its session from the store, so an
ending is seen at once. The browser holds a random secret (an HttpOnly, SameSite=Strict
cookie); the store only its SHA-256. Every session has its own CSRF token, which each form
carries and each mutation checks.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.tables import ConsoleSessionRow


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class ConsoleSession:
    id: str
    actor: str
    csrf_token: str
    expires_at: datetime

    def check_csrf(self, presented: str | None) -> bool:
        return hmac.compare_digest((presented or "").encode(), self.csrf_token.encode())


class ConsoleSessions:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], lifetime: timedelta) -> None:
        self._sessions = sessions
        self._lifetime = lifetime

    async def start(self, admin_token: str, actor: str) -> str:
        """A new session for ``admin_token`` (already checked): the secret the browser
        presents."""
        await self._forget_expired()
        secret = secrets.token_urlsafe(32)
        row = ConsoleSessionRow(
            id=sha256(secret),
            actor=actor,
            admin_token_sha256=sha256(admin_token),
            csrf_token=secrets.token_urlsafe(32),
            created_at=now(),
            expires_at=now() + self._lifetime,
        )
        async with self._sessions.begin() as session:
            session.add(row)
        return secret

    async def find(
        self, secret: str | None, accepted_tokens: Iterable[str]
    ) -> ConsoleSession | None:
        """The live session ``secret`` names, if any. One whose admin token is no longer in
        ``accepted_tokens`` is ended here, for every replica."""
        if not secret:
            return None
        async with self._sessions() as session:
            row = await session.get(ConsoleSessionRow, sha256(secret))
        if row is None or row.ended_at is not None or row.expires_at <= now():
            return None
        if row.admin_token_sha256 not in {sha256(token) for token in accepted_tokens}:
            await self.end(row.id, "token removed")
            return None
        return _session(row)

    async def end(self, session_id: str, why: str) -> None:
        async with self._sessions.begin() as session:
            await session.execute(
                update(ConsoleSessionRow)
                .where(ConsoleSessionRow.id == session_id, ConsoleSessionRow.ended_at.is_(None))
                .values(ended_at=now(), ended_by=why)
            )

    async def _forget_expired(self) -> None:
        """Sessions that ended or expired a day ago go (the audit log keeps their story)."""
        cutoff = now() - timedelta(days=1)
        async with self._sessions.begin() as session:
            await session.execute(
                delete(ConsoleSessionRow).where(
                    (ConsoleSessionRow.expires_at < cutoff) | (ConsoleSessionRow.ended_at < cutoff)
                )
            )


def _session(row: ConsoleSessionRow) -> ConsoleSession:
    return ConsoleSession(row.id, row.actor, row.csrf_token, row.expires_at)
