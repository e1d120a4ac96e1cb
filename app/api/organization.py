"""``/v1/organization``: a tenant reads its own usage and limits with any of its API keys.

Usage comes from the ledger in the store (every replica's requests) in the shape of OpenAI's
Usage API; limits from the quota backend. Neither call uses tokens or counts against the
tenant's limits: they have a small rate limit of their own, per key and replica
(``self_service_requests_per_minute``)."""

from __future__ import annotations

import base64
import binascii
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from app.api.deps import CurrentPrincipal, GatewayDep
from app.api.openai import ERROR_RESPONSES
from app.errors import BadRequestError
from app.protocol.organization import (
    BUCKET_SECONDS,
    DEFAULT_BUCKETS,
    MAX_BUCKETS,
    BucketWidth,
    BudgetState,
    CompletionsUsageResult,
    ConcurrencyState,
    OrganizationLimits,
    RateLimitState,
    SubjectLimits,
    UsageBucket,
    UsagePage,
)
from app.quota.errors import QuotaExceeded
from app.quota.headers import remaining, retry_headers
from app.quota.limits import Limits, QuotaUsage
from app.serving.lifecycle.tracking import key_subject
from app.tenancy.tenants import Principal
from app.usage import BucketGroup, usage_by_bucket

router = APIRouter(prefix="/v1/organization", tags=["tenant self-service"])

USAGE_PARAMETERS = frozenset(
    {
        "start_time",
        "end_time",
        "bucket_width",
        "group_by",
        "models",
        "api_key_ids",
        "batch",
        "limit",
        "page",
    }
)


async def self_service_caller(principal: CurrentPrincipal, gateway: GatewayDep) -> Principal:
    """The calling key's tenant, once the key is within its self-service rate limit."""
    wait = gateway.self_service_limit.take(principal.key_id)
    if wait > 0:
        raise QuotaExceeded(
            f"Rate limit of {gateway.self_service_limit.per_minute} usage and limits calls "
            "per minute reached for this API key.",
            limit="requests",
            subject=principal.key_id,
            retry_after=wait,
            headers=retry_headers(wait),
        )
    return principal


Caller = Annotated[Principal, Depends(self_service_caller)]
# Up to the last second of year 9999, the last a datetime holds.
UnixSeconds = Annotated[int, Query(ge=0, le=253_402_300_799)]


@router.get("/usage/completions", response_model=UsagePage, responses=ERROR_RESPONSES)
async def completions_usage(
    request: Request,
    caller: Caller,
    gateway: GatewayDep,
    start_time: UnixSeconds,
    end_time: UnixSeconds | None = None,
    bucket_width: BucketWidth = "1d",
    group_by: Annotated[list[BucketGroup] | None, Query()] = None,
    models: Annotated[list[str] | None, Query(max_length=100)] = None,
    api_key_ids: Annotated[list[str] | None, Query(max_length=100)] = None,
    limit: Annotated[int | None, Query(ge=1, description="Buckets per page.")] = None,
    page: str | None = None,
    batch: Annotated[
        bool | None,
        Query(description="Only batch lines (true) or only online requests (false)."),
    ] = None,
) -> UsagePage:
    """The tenant's requests and tokens in time buckets, from ``start_time`` to ``end_time``
    (now by default): every API key of the tenant, never another tenant's."""
    unknown = sorted(set(request.query_params) - USAGE_PARAMETERS)
    if unknown:
        raise BadRequestError(
            f"Unsupported parameter `{unknown[0]}`: usage covers this API key's tenant, "
            "grouped by model, api_key_id or batch.",
            param=unknown[0],
        )
    # By default up to the end of this second: a request started now is in the report.
    end = int(time.time()) + 1 if end_time is None else end_time
    if end <= start_time:
        raise BadRequestError("`end_time` must be after `start_time`.", param="end_time")
    if limit is not None and limit > MAX_BUCKETS[bucket_width]:
        raise BadRequestError(
            f"`limit` may be at most {MAX_BUCKETS[bucket_width]} with bucket_width {bucket_width}.",
            param="limit",
        )
    width = BUCKET_SECONDS[bucket_width]
    first = start_time if page is None else _page_start(page, start_time, end, width)
    last = min(end, first + (limit or DEFAULT_BUCKETS[bucket_width]) * width)
    groups = set(group_by or ())
    await gateway.ledger.flush()  # include what finished a moment ago on this replica
    totals = await usage_by_bucket(
        gateway.sessions,
        caller.tenant.uid,
        start=first,
        end=last,
        width=width,
        group_by=groups,
        models=models or (),
        key_ids=api_key_ids or (),
        batch=batch,
    )
    names = {}
    if "api_key_id" in groups:
        names = {key.id: key.name for key in await gateway.admin.list_keys(caller.tenant.id)}
    buckets = [
        UsageBucket(start_time=start, end_time=min(start + width, end), results=[])
        for start in range(first, last, width)
    ]
    for total in totals:
        buckets[(total.start - first) // width].results.append(
            CompletionsUsageResult(
                input_tokens=total.prompt_tokens,
                output_tokens=total.completion_tokens,
                num_model_requests=total.requests,
                model=total.model,
                api_key_id=total.key_id,
                api_key_name=names.get(total.key_id) if total.key_id else None,
                batch=total.batch,
            )
        )
    has_more = last < end
    return UsagePage(data=buckets, has_more=has_more, next_page=_page(last) if has_more else None)


def _page(start: int) -> str:
    return "page_" + base64.urlsafe_b64encode(str(start).encode()).decode()


def _page_start(page: str, start: int, end: int, width: int) -> int:
    """The first bucket of the page ``page`` names, if it is one of this report's."""
    try:
        first = int(base64.urlsafe_b64decode(page.removeprefix("page_").encode()))
    except (binascii.Error, ValueError):
        first = -1
    if not start <= first < end or (first - start) % width:
        raise BadRequestError(
            "`page` is not a page of this report: pass the `next_page` of the previous page, "
            "with the same start_time, end_time and bucket_width.",
            param="page",
        )
    return first


@router.get("/limits", response_model=OrganizationLimits, responses=ERROR_RESPONSES)
async def limits(caller: Caller, gateway: GatewayDep) -> OrganizationLimits:
    """The tenant's limits and the calling key's own, each with what is left of it now (read
    from the quota store: what every replica sharing it has charged)."""
    tenant, key = caller.tenant, caller.key
    tenant_usage = await gateway.quota.usage(tenant.quota_subject, tenant.limits)
    key_usage = await gateway.quota.usage(key_subject(key), key.limits)
    return OrganizationLimits(
        tenant=_state(tenant.limits, tenant_usage),
        api_key_id=key.id,
        api_key=_state(key.limits, key_usage),
    )


def _rate(limit: int | None, level: float | None) -> RateLimitState | None:
    if limit is None:
        return None
    level = max(0.0, level or 0.0)
    return RateLimitState(
        limit=limit, remaining=remaining(limit, level), reset_seconds=round(level * 60 / limit, 3)
    )


def _state(limits: Limits, usage: QuotaUsage) -> SubjectLimits:
    concurrency = budget = None
    if limits.max_concurrent is not None:
        in_use = usage.concurrent
        concurrency = ConcurrencyState(
            limit=limits.max_concurrent,
            in_use=in_use,
            remaining=max(0, limits.max_concurrent - in_use),
        )
    if limits.token_budget is not None and limits.budget_period is not None:
        used = usage.budget_used or 0
        budget = BudgetState(
            limit=limits.token_budget,
            used=used,
            remaining=max(0, limits.token_budget - used),
            period=limits.budget_period,
            current_period=usage.budget_period or "",
        )
    return SubjectLimits(
        requests_per_minute=_rate(limits.requests_per_minute, usage.requests),
        tokens_per_minute=_rate(limits.tokens_per_minute, usage.tokens),
        concurrent_requests=concurrency,
        token_budget=budget,
    )
