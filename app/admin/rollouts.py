"""An alias's versions side by side, from the usage ledger (so every replica's traffic is in
it), and the automatic rollback that the same figures decide (docs/rollouts.md)."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import InstrumentedAttribute

from app.admin.service import AdminService
from app.store.tables import UsageRow, VersionMinuteRow
from app.tenancy.registry import TenantRegistry
from app.usage.version_minutes import minute_of

logger = logging.getLogger(__name__)


@dataclass
class VersionStats:
    """How one version of an alias served its requests over a window."""

    version: int
    requests: int = 0
    errors: int = 0
    """Requests that failed by the version's doing: on the engine, loading the adapter or
    upstream (refusals never reach the ledger; failures that are the request's own, such as
    a grammar the engine gave up on, are not counted)."""
    finish_reasons: dict[str, int] = field(default_factory=dict)
    ttft_ms: list[int] = field(default_factory=list, repr=False)
    itl_ms: list[float] = field(default_factory=list, repr=False)
    completion_tokens: list[int] = field(default_factory=list, repr=False)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def summary(self) -> dict[str, object]:
        return {
            "version": self.version,
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 4),
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
            "ttft_ms": _quantiles(self.ttft_ms),
            "itl_ms": _quantiles(self.itl_ms),
            "completion_tokens": _quantiles(self.completion_tokens),
        }


def _quantiles(values: list[int] | list[float]) -> dict[str, float] | None:
    """p50, p95 and mean; None without values."""
    if not values:
        return None
    ordered = sorted(values)

    def at(quantile: float) -> float:
        return float(ordered[min(len(ordered) - 1, int(quantile * len(ordered)))])

    return {"p50": at(0.5), "p95": at(0.95), "mean": round(statistics.fmean(ordered), 2)}


SAMPLE_ROWS = 10_000
"""The percentiles of a version are of its latest requests, this many at most."""


async def version_stats(
    sessions: async_sessionmaker[AsyncSession],
    tenant_uid: str,
    alias: str,
    since: datetime,
    *,
    adapter: str,
) -> list[VersionStats]:
    """Each of ``adapter``'s versions' figures for ``alias`` of the tenant (``uid``) since
    ``since``: every request counted in the store (:func:`version_counts`), the percentiles
    of each version's latest :data:`SAMPLE_ROWS`."""
    async with sessions() as session:
        by_version = await version_counts(
            session, tenant_uid, alias, adapter, since, finish_reasons=True
        )
        for version, stats in by_version.items():
            latest = (
                select(UsageRow.ttft_ms, UsageRow.itl_ms, UsageRow.completion_tokens)
                .where(*_requests_of(tenant_uid, alias, adapter))
                .where(UsageRow.adapter_version == version, UsageRow.started_at >= since)
                .order_by(UsageRow.started_at.desc())
                .limit(SAMPLE_ROWS)
            )
            for ttft, itl, completion in await session.execute(latest):
                if ttft is not None:
                    stats.ttft_ms.append(ttft)
                if itl is not None:
                    stats.itl_ms.append(itl)
                stats.completion_tokens.append(completion)
    return [by_version[v] for v in sorted(by_version)]


async def version_counts(
    session: AsyncSession,
    tenant_uid: str,
    alias: str,
    adapter: str,
    since: datetime,
    *,
    finish_reasons: bool = False,
) -> dict[int, VersionStats]:
    """Each of ``adapter``'s versions' requests for ``alias`` since ``since``, and its
    failures by its doing (and its finish reasons where asked), counted in the store: whole
    minutes from the per-minute counts, the first minute's part from the requests' rows (an
    index finds them); a few rows come back, however many requests there were."""
    edge = minute_of(since)
    if edge < since:
        edge += timedelta(minutes=1)
    whole = case((VersionMinuteRow.minute >= edge, 1), else_=0)
    columns: list[ColumnElement[Any] | InstrumentedAttribute[Any]] = [
        VersionMinuteRow.adapter_version
    ]
    if finish_reasons:
        columns.append(VersionMinuteRow.finish_reason)
    minutes = (
        select(
            *columns,
            func.sum(VersionMinuteRow.requests * whole),
            func.sum(VersionMinuteRow.errors * whole),
        )
        .where(
            VersionMinuteRow.tenant_uid == tenant_uid,
            VersionMinuteRow.model == alias,
            VersionMinuteRow.adapter == adapter,
            # The first minute's row tells which versions it holds; its part is read below.
            VersionMinuteRow.minute >= minute_of(since),
        )
        .group_by(*columns)
    )
    by_version: dict[int, VersionStats] = {}
    for version, *reason, requests, errors in await session.execute(minutes):
        _add(by_version, version, reason, int(requests or 0), int(errors or 0))
    if edge > since and by_version:
        failed = case((UsageRow.fault == "version", 1), else_=0)
        row_columns: list[ColumnElement[Any] | InstrumentedAttribute[Any]] = [
            UsageRow.adapter_version
        ]
        if finish_reasons:
            row_columns.append(func.coalesce(UsageRow.finish_reason, ""))
        first_minute = (
            select(*row_columns, func.count(), func.sum(failed))
            .where(
                *_requests_of(tenant_uid, alias, adapter),
                UsageRow.adapter_version.in_(sorted(by_version)),
                UsageRow.started_at >= since,
                UsageRow.started_at < edge,
            )
            .group_by(*row_columns)
        )
        for version, *reason, requests, errors in await session.execute(first_minute):
            _add(by_version, version, reason, int(requests), int(errors or 0))
    return {version: stats for version, stats in by_version.items() if stats.requests}


def _requests_of(tenant_uid: str, alias: str, adapter: str) -> tuple[ColumnElement[bool], ...]:
    return (
        UsageRow.tenant_uid == tenant_uid,
        UsageRow.model == alias,
        UsageRow.adapter == adapter,
    )


def _add(
    by_version: dict[int, VersionStats],
    version: int,
    reason: list[str],
    requests: int,
    errors: int,
) -> None:
    stats = by_version.setdefault(version, VersionStats(version))
    stats.requests += requests
    stats.errors += errors
    if reason and reason[0] and requests:
        stats.finish_reasons[reason[0]] = stats.finish_reasons.get(reason[0], 0) + requests


async def apply_rollback_rules(
    admin: AdminService,
    sessions: async_sessionmaker[AsyncSession],
    registry: TenantRegistry,
    now: datetime,
) -> list[str]:
    """Roll back every split whose rule a version now breaks; what was rolled back. A split
    is judged on its own adapter's requests since its last change, and rolled back only if it
    is still the grant that was judged."""
    done = []
    for tenant, alias, grant in registry.rollouts():
        rule = grant.rollback
        if rule is None:
            continue
        since = now - timedelta(seconds=rule.window_seconds)
        if grant.changed_at is not None:
            since = max(since, grant.changed_at)
        adapter = grant.versions[0].adapter.name
        judged = {w.adapter.version for w in grant.versions} - {rule.to}  # not the shadow
        async with sessions() as session:
            counts = await version_counts(session, tenant.uid, alias, adapter, since)
        failing = [
            stats
            for stats in counts.values()
            if stats.version in judged
            and stats.requests >= rule.min_requests
            and stats.error_rate > rule.error_rate
        ]
        if not failing:
            continue
        worst = max(failing, key=lambda s: s.error_rate)
        reason = (
            f"v{worst.version} failed {worst.errors} of {worst.requests} requests "
            f"({worst.error_rate:.1%} > {rule.error_rate:.1%}) in {rule.window_seconds} s"
        )
        if await admin.grants.roll_back_by_rule(tenant.id, alias, reason, judged=grant.revision):
            logger.warning("rolled %s:%s back to v%d: %s", tenant.id, alias, rule.to, reason)
            done.append(f"{tenant.id}:{alias}")
    return done
