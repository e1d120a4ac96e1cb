"""An alias's versions side by side, from the usage ledger (so every replica's traffic is in
it), and the automatic rollback that the same figures decide (docs/rollouts.md)."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin.service import AdminService
from app.store.tables import UsageRow
from app.tenancy.registry import TenantRegistry

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


async def version_stats(
    sessions: async_sessionmaker[AsyncSession],
    tenant_uid: str,
    alias: str,
    since: datetime,
    *,
    adapter: str | None = None,
) -> list[VersionStats]:
    """Each version's figures for ``alias`` of the tenant (``uid``) since ``since``: of
    ``adapter``'s versions where it is named (an alias may have served several adapters)."""
    query = select(
        UsageRow.adapter_version,
        UsageRow.fault,
        UsageRow.finish_reason,
        UsageRow.ttft_ms,
        UsageRow.itl_ms,
        UsageRow.completion_tokens,
    ).where(
        UsageRow.tenant_uid == tenant_uid,
        UsageRow.model == alias,
        UsageRow.started_at >= since,
        UsageRow.adapter_version.is_not(None),
    )
    if adapter is not None:
        query = query.where(UsageRow.adapter == adapter)
    by_version: dict[int, VersionStats] = {}
    async with sessions() as session:
        for version, fault, finish, ttft, itl, completion in await session.execute(query):
            if version is None:  # excluded by the query
                continue
            stats = by_version.setdefault(version, VersionStats(version))
            stats.requests += 1
            stats.errors += fault == "version"
            if finish:
                stats.finish_reasons[finish] = stats.finish_reasons.get(finish, 0) + 1
            if ttft is not None:
                stats.ttft_ms.append(ttft)
            if itl is not None:
                stats.itl_ms.append(itl)
            stats.completion_tokens.append(completion)
    return [by_version[v] for v in sorted(by_version)]


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
        failing = [
            stats
            for stats in await version_stats(sessions, tenant.uid, alias, since, adapter=adapter)
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
