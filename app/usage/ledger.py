"""The usage ledger: one record per request, written in batches off the hot path.

Nothing billed is lost quietly:

* a write is never cancelled halfway: the writer shields it, and :meth:`UsageLedger.close`
  waits for it before writing the rest;
* while the store is down the records wait in memory, up to ``backlog_max``: past that the
  oldest are dropped (the records kept are the latest, so the gap is one stretch of time at the
  start of the outage), counted (``lora_gateway_usage_records{outcome="dropped"}``) and logged
  with the time range they cover;
* each batch adds its records to the versions' per-minute counts
  (:mod:`app.usage.version_minutes`) in the transaction that writes them;
* a batch the store refuses for what is in it (not because it is down) is written again record
  by record: one that fails on its own is set aside, counted (``outcome="rejected"``) and
  logged in full for replay, and no longer blocks the records after it;
* what :meth:`UsageLedger.close` cannot write at shutdown is logged in full
  (``outcome="logged"``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from functools import partial
from typing import Any, Literal

from sqlalchemy import Connection, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import metrics
from app.store.db import store_is_down
from app.store.tables import UsageRow
from app.store.transactions import transactions
from app.usage.refusals import RefusalCounts, add_refusals
from app.usage.version_minutes import add_version_minutes

logger = logging.getLogger(__name__)

Fault = Literal["version", "request"]
"""Whose doing a failed request was: its version's (the engine, the adapter's load or the
upstream failed it), which the version's rollback rule counts, or the request's own (what it
asked was refused, or was a grammar the engine gave up on), which it does not."""

FLUSH_SECONDS = 1.0
LOG_EVERY_SECONDS = 60.0
"""While the store is down or the backlog overflows, how often the log says so again."""
CLOSE_TIMEOUT_SECONDS = 10.0
"""How long shutdown waits for the last write before logging what is left instead."""


@dataclass(frozen=True)
class UsageRecord:
    request_id: str
    tenant_id: str
    # Which of the tenants that had ``tenant_id`` made the request (``Tenant.uid``).
    tenant_uid: str
    key_id: str
    endpoint: str
    model: str
    adapter: str | None
    adapter_version: int | None
    prompt_tokens: int
    completion_tokens: int
    status: Literal["ok", "cancelled", "error"]
    latency_ms: int
    started_at: datetime
    finished_at: datetime
    # OpenAI's `user`, where the request named one: recorded, never sent to the engine.
    user: str | None = None
    finish_reason: str | None = None
    ttft_ms: int | None = None
    itl_ms: float | None = None
    # A shadow run (the request again on a candidate version): in the ledger, never billed.
    shadow: bool = False
    # Whose doing an ``error`` was; None for the other statuses.
    fault: Fault | None = None
    # The batch it was a line of; None for an online request.
    batch_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields by name. Every value is a scalar or a datetime, so this shallow dict is
        the whole record (``dataclasses.asdict`` would deep-copy each value, for nothing)."""
        return {name: getattr(self, name) for name in _RECORD_FIELDS}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), default=str, sort_keys=True)


_RECORD_FIELDS = tuple(f.name for f in fields(UsageRecord))
_USAGE_TABLE = UsageRow.metadata.tables[UsageRow.__tablename__]


def write_rows(connection: Connection, rows: list[dict[str, Any]]) -> None:
    """Write usage ``rows`` (:meth:`UsageRecord.as_dict`) and add them to the versions' counts,
    in ``connection``'s transaction."""
    # One executemany of plain rows: the ORM's unit of work (an object, its state and
    # identity per record, flushed) cost more than the rest of a short request.
    if rows:
        connection.execute(insert(_USAGE_TABLE), rows)
        add_version_minutes(connection, rows)


async def write_records(session: AsyncSession, records: Iterable[UsageRecord]) -> None:
    """:func:`write_rows` in ``session``'s transaction: a batch line's, whose record commits
    with its output."""
    rows = [record.as_dict() for record in records]
    if rows:
        await session.run_sync(lambda sync: write_rows(sync.connection(), rows))


class UsageLedger:
    """``record`` only appends to memory; ``run`` writes what accumulated every second, one
    transaction per batch; ``close`` writes the rest at shutdown (see the module's contract)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        backlog_max: int = 100_000,
        close_timeout: float | None = None,
    ) -> None:
        if backlog_max < 1:
            raise ValueError("backlog_max must be positive")
        self._sessions = sessions
        # Its writes in one call to a thread of its own where the store is a SQLite file: a
        # flush every second through the shared sessions was a dozen handoffs between threads.
        self._transactions = transactions(sessions, "usage-writer")
        self._backlog_max = backlog_max
        self._close_timeout = CLOSE_TIMEOUT_SECONDS if close_timeout is None else close_timeout
        self._pending: deque[UsageRecord] = deque()
        self._writing = 0
        self._refusals = RefusalCounts()
        self._lock = asyncio.Lock()
        self._writer: asyncio.Task[None] | None = None
        self._down_since: float | None = None
        self._last_down_log = 0.0
        # The first and last records dropped since the log last said so, and how many.
        self._dropped: tuple[UsageRecord, UsageRecord] | None = None
        self._dropped_count = 0
        self._last_drop_log = 0.0
        # What this ledger last added to the gauge: it adds its changes, so that ledgers
        # sharing a process (tests serving gateways side by side) sum rather than overwrite.
        self._queued_gauge = metrics.USAGE_PENDING.labels("queued")
        self._writing_gauge = metrics.USAGE_PENDING.labels("writing")
        self._reported = (0, 0)

    @property
    def pending(self) -> int:
        """Records not yet written (waiting, or in the write under way)."""
        return len(self._pending) + self._writing

    def record(self, record: UsageRecord) -> None:
        self._pending.append(record)
        self._trim()
        self._report()

    def refused(self, tenant_uid: str, tenant_id: str, limit: str) -> None:
        """Count a request a quota limit refused (added to the store with the next write)."""
        self._refusals.count(tenant_uid, tenant_id, limit, time.time())

    async def flush(self) -> int:
        """Write every pending record, and the refusals counted, now; how many records were
        written. Raises when the store is down: what was not written stays pending. Writes
        run one at a time."""
        async with self._lock:
            written = await self._flush_records()
            if self._refusals:
                refusals = self._refusals.take()
                try:
                    async with self._sessions.begin() as session:
                        await add_refusals(session, refusals)
                except BaseException:
                    self._refusals.put_back(refusals)
                    raise
            return written

    async def _flush_records(self) -> int:
        batch = list(self._pending)
        self._pending.clear()
        self._writing = len(batch)
        try:
            return await self._write(batch)
        except BaseException:
            # Down, or cancelled mid-write: put back what was not written, first in line.
            self._writing = 0
            self._pending.extendleft(reversed(batch))
            self._trim()
            raise
        finally:
            self._writing = 0
            self._report()

    async def run(self) -> None:
        """Write every second until cancelled; a write under way when it is cancelled goes
        on to its end (:meth:`close` waits for it)."""
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            self._writer = asyncio.ensure_future(self._flush_logged())
            await asyncio.shield(self._writer)

    async def close(self) -> None:
        """Write what is left, after any write under way; what cannot be written within
        ``close_timeout`` is logged in full, one line per record. Never raises."""
        try:
            await self._write_the_rest()
        finally:
            await self._transactions.close()

    async def _write_the_rest(self) -> None:
        try:
            await asyncio.wait_for(self.flush(), self._close_timeout)
        except (Exception, asyncio.TimeoutError) as exc:
            logger.error("could not write the last usage records at shutdown: %r", exc)
        if self._writer is not None and not self._writer.done():
            # Still stuck on the store: cancelling it puts its batch back, to be logged.
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        self._log_dropped(force=True)
        if not self._pending:
            return
        left = list(self._pending)
        self._pending.clear()
        self._report()
        logger.error(
            "%d usage records were not written; each is logged in full below",
            len(left),
        )
        for record in left:
            logger.error("unwritten usage record %s", record.to_json())
        metrics.USAGE_RECORDS.labels("logged").inc(len(left))

    # -- writing -------------------------------------------------------------------------------

    async def _flush_logged(self) -> None:
        try:
            written = await self.flush()
        except Exception as exc:
            self._store_failed(exc)
            return
        if self._down_since is not None and written:
            logger.warning(
                "usage store writable again after %.0f s: %d records written, %d pending",
                time.monotonic() - self._down_since,
                written,
                self.pending,
            )
            self._down_since = None

    async def _write(self, batch: list[UsageRecord]) -> int:
        if not batch:
            return 0
        try:
            await self._insert(batch)
        except Exception as exc:
            if store_is_down(exc):
                raise
            return await self._write_one_by_one(batch)
        metrics.USAGE_RECORDS.labels("written").inc(len(batch))
        return len(batch)

    async def _write_one_by_one(self, batch: list[UsageRecord]) -> int:
        """Write each record alone; set aside those that fail alone while the store is up.
        Raises (the caller restores ``batch``) once the store is down; ``batch`` then holds
        only what is still unwritten."""
        written = 0
        while batch:
            record = batch[0]
            try:
                await self._insert([record])
            except Exception as exc:
                if store_is_down(exc):
                    raise
                self._set_aside(record, exc, duplicate=await self._exists(record))
            else:
                written += 1
                metrics.USAGE_RECORDS.labels("written").inc()
            batch.pop(0)
            self._writing = len(batch)
        return written

    async def _insert(self, records: Iterable[UsageRecord]) -> None:
        """Write ``records``, and add them to the versions' counts, in one transaction."""
        rows = [record.as_dict() for record in records]
        await self._transactions.run(partial(write_rows, rows=rows))

    async def _exists(self, record: UsageRecord) -> bool:
        """Whether ``record`` is in the store already (a write that was reported failed after
        it committed)."""
        try:
            async with self._sessions() as session:
                query = select(UsageRow.id).where(UsageRow.request_id == record.request_id)
                return (await session.execute(query)).first() is not None
        except Exception:
            return False

    def _set_aside(self, record: UsageRecord, exc: Exception, *, duplicate: bool) -> None:
        if duplicate:
            metrics.USAGE_RECORDS.labels("duplicate").inc()
            logger.info("usage record %s was already written", record.request_id)
            return
        metrics.USAGE_RECORDS.labels("rejected").inc()
        logger.error("usage record set aside, the store refuses it (%r): %s", exc, record.to_json())

    # -- the backlog ---------------------------------------------------------------------------

    def _trim(self) -> None:
        while len(self._pending) + self._writing > self._backlog_max and self._pending:
            dropped = self._pending.popleft()
            self._dropped_count += 1
            self._dropped = (dropped if self._dropped is None else self._dropped[0], dropped)
            metrics.USAGE_RECORDS.labels("dropped").inc()
        self._log_dropped()

    def _log_dropped(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._dropped is None or (not force and now - self._last_drop_log < LOG_EVERY_SECONDS):
            return
        first, last = self._dropped
        logger.error(
            "usage backlog full (usage_backlog_max=%d): dropped the %d oldest records, "
            "of requests started from %s to %s (request ids %s to %s)",
            self._backlog_max,
            self._dropped_count,
            first.started_at.isoformat(),
            last.started_at.isoformat(),
            first.request_id,
            last.request_id,
        )
        self._last_drop_log = now
        self._dropped_count = 0
        self._dropped = None

    def _store_failed(self, exc: Exception) -> None:
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = self._last_down_log = now
            logger.error(
                "could not write %d usage records; they are kept and retried (up to "
                "usage_backlog_max=%d)",
                self.pending,
                self._backlog_max,
                exc_info=exc,
            )
        elif now - self._last_down_log >= LOG_EVERY_SECONDS:
            self._last_down_log = now
            logger.error(
                "usage store still failing after %.0f s (%r): %d records pending",
                now - self._down_since,
                exc,
                self.pending,
            )

    def _report(self) -> None:
        queued, writing = len(self._pending), self._writing
        if (queued, writing) != self._reported:
            self._queued_gauge.inc(queued - self._reported[0])
            self._writing_gauge.inc(writing - self._reported[1])
            self._reported = (queued, writing)
