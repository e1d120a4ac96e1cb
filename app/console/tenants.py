"""Tenants: the searchable list, and each tenant's page (settings, keys, quotas, grants with
their rollouts, usage) with the forms that change them, through the admin service as the
REST API does."""

from __future__ import annotations

import csv
import io
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response
from pydantic_core import from_json

from app.admin import schemas
from app.admin.rollouts import version_stats
from app.admin.sessions import ConsoleSession
from app.api.deps import GatewayDep
from app.console.auth import Mutation, Session
from app.console.charts import Chart, bar_chart, series
from app.console.forms import FormError, audit_refusal, checkbox, model, optional_int, text
from app.console.rendering import CONSOLE_PREFIX, ConsoleRoute, page
from app.errors import BadRequestError, GatewayError
from app.gateway import Gateway
from app.protocol import INT64_MAX
from app.usage import usage_by_bucket, usage_totals

router = APIRouter(prefix="/tenants", route_class=ConsoleRoute)

PAGE_SIZE = 50
USAGE_DAYS = 31
BATCHES_SHOWN = 20
ACTIVE_BATCH_STATUSES = ("validating", "in_progress")
"""The statuses a batch can be cancelled from."""


def _tenant_url(tenant_id: str, notice: str = "") -> str:
    return f"{CONSOLE_PREFIX}/tenants/{tenant_id}" + (f"?notice={notice}" if notice else "")


@router.get("")
async def tenants(
    request: Request,
    session: Session,
    gateway: GatewayDep,
    q: str = Query("", max_length=200),
    offset: int = Query(0, ge=0, le=INT64_MAX),
) -> Response:
    return await tenants_page(request, session, gateway, q=q, offset=offset)


async def tenants_page(
    request: Request,
    session: ConsoleSession,
    gateway: Gateway,
    *,
    q: str = "",
    offset: int = 0,
    error: FormError | None = None,
) -> Response:
    listed = await gateway.admin.tenants_page(q, offset, PAGE_SIZE)
    status = error.status if error else 200
    return page(request, "tenants.html", session, status=status, listed=listed, q=q, error=error)


@router.post("")
async def create_tenant(request: Request, session: Mutation, gateway: GatewayDep) -> Response:
    form = await request.form()
    try:
        body = model(
            schemas.TenantCreate,
            {
                "id": text(form, "id"),
                "name": text(form, "name"),
                "allow_base_model": checkbox(form, "allow_base_model"),
                "weight": optional_int(form, "weight"),
                "priority": text(form, "priority"),
                "slo_ttft_ms": optional_int(form, "slo_ttft_ms"),
                "slo_tpot_ms": optional_int(form, "slo_tpot_ms"),
            },
        )
        await gateway.admin.create_tenant(session.actor, body)
    except GatewayError as exc:
        await audit_refusal(gateway.admin, session.actor, "tenant.create", exc)
        return await tenants_page(request, session, gateway, error=FormError.of("create", exc))
    return RedirectResponse(_tenant_url(body.id, "created"), status_code=303)


async def _usage_charts(
    gateway: Gateway, tenant_uid: str, key_names: dict[str, str]
) -> list[Chart]:
    """Tokens and requests per day, tokens by model and by key (names, not ids)."""
    now = int(time.time())
    start = now // 86400 * 86400 - (USAGE_DAYS - 1) * 86400
    end = start + USAGE_DAYS * 86400
    per_day = await usage_by_bucket(gateway.sessions, tenant_uid, start=start, end=end, width=86400)
    tokens = {t.start: t.prompt_tokens + t.completion_tokens for t in per_day}
    requests = {t.start: t.requests for t in per_day}
    by_model = await usage_totals(
        gateway.sessions, tenant_uid, start=None, end=None, group_by="adapter"
    )
    by_key = await usage_totals(gateway.sessions, tenant_uid, start=None, end=None, group_by="key")
    daily = {"start": start, "width": 86400, "count": USAGE_DAYS}
    return [
        bar_chart(
            "tenant-tokens", f"Tokens per day, last {USAGE_DAYS} days", series(tokens, **daily)
        ),
        bar_chart(
            "tenant-requests",
            f"Requests per day, last {USAGE_DAYS} days",
            series(requests, **daily),
        ),
        bar_chart(
            "tenant-models",
            "Tokens by model, all time",
            [(t.group or "", t.prompt_tokens + t.completion_tokens) for t in by_model],
        ),
        bar_chart(
            "tenant-keys",
            "Tokens by key, all time",
            [
                (
                    key_names.get(t.group or "", t.group or ""),
                    t.prompt_tokens + t.completion_tokens,
                )
                for t in by_key
            ],
        ),
    ]


@router.get("/{tenant_id}")
async def tenant(
    request: Request, tenant_id: str, session: Session, gateway: GatewayDep, notice: str = ""
) -> Response:
    return await tenant_page(request, tenant_id, session, gateway, notice=notice)


async def tenant_page(
    request: Request,
    tenant_id: str,
    session: ConsoleSession,
    gateway: Gateway,
    *,
    notice: str = "",
    error: FormError | None = None,
    created_key: schemas.KeyCreated | None = None,
) -> Response:
    admin = gateway.admin
    row = await admin.get_tenant(tenant_id)  # 404 for an unknown tenant
    keys = await admin.list_keys(tenant_id)
    key_quotas = {key.id: await admin.get_key_quota(tenant_id, key.id) for key in keys}
    grants = await admin.grants.for_tenant(tenant_id)
    cap, used = await gateway.files.store.storage_room(tenant_id, row.uid)
    await gateway.ledger.flush()  # this replica's latest requests are in the charts
    comparisons = {}
    for grant in grants:
        if grant.weights or grant.shadow:
            since = datetime.now(timezone.utc) - timedelta(hours=1)
            comparisons[grant.alias] = await version_stats(
                gateway.sessions, row.uid, grant.alias, since, adapter=grant.adapter_name
            )
    status = error.status if error else 201 if created_key else 200
    return page(
        request,
        "tenant.html",
        session,
        status=status,
        tenant=row,
        class_objectives=_class_objectives(gateway, row.priority),
        keys=keys,
        key_quotas=key_quotas,
        quota=await admin.get_quota(tenant_id),
        storage_used=used,
        storage_cap=cap,
        grants=grants,
        comparisons=comparisons,
        adapters=await admin.adapters_page(limit=None),
        charts=await _usage_charts(gateway, row.uid, {key.id: key.name or key.id for key in keys}),
        batches=await gateway.batches.latest(row.uid, BATCHES_SHOWN),
        cancellable=ACTIVE_BATCH_STATUSES,
        notice=notice,
        error=error,
        created_key=created_key,
    )


def _class_objectives(gateway: Gateway, priority: str) -> dict[str, float | None]:
    """The objectives, in ms, of the priority class a tenant with none of its own has."""
    settings = gateway.settings
    if priority == "batch":
        return {"ttft": settings.slo_ttft_ms_batch, "tpot": settings.slo_tpot_ms_batch}
    return {"ttft": settings.slo_ttft_ms_interactive, "tpot": settings.slo_tpot_ms_interactive}


@router.get("/{tenant_id}/usage.csv")
async def usage_csv(tenant_id: str, session: Session, gateway: GatewayDep) -> Response:
    """Every day of the last 31 with requests, by model and key."""
    row = await gateway.admin.get_tenant(tenant_id)
    await gateway.ledger.flush()
    now = int(time.time())
    start = now // 86400 * 86400 - (USAGE_DAYS - 1) * 86400
    totals = await usage_by_bucket(
        gateway.sessions,
        row.uid,
        start=start,
        end=start + USAGE_DAYS * 86400,
        width=86400,
        group_by=("model", "api_key_id"),
    )
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["day", "model", "api_key_id", "requests", "input_tokens", "output_tokens"])
    for t in totals:
        day = time.strftime("%Y-%m-%d", time.gmtime(t.start))
        writer.writerow([day, t.model, t.key_id, t.requests, t.prompt_tokens, t.completion_tokens])
    return Response(
        out.getvalue(),
        media_type="text/csv",
        headers={"content-disposition": f'attachment; filename="{tenant_id}-usage.csv"'},
    )


# -- mutations: each one form, redirecting back with a notice, or the page with the refusal ----


async def _mutate(
    request: Request,
    tenant_id: str,
    session: Mutation,
    gateway: GatewayDep,
    form_id: str,
    action: str,
    change: Any,
) -> Response:
    try:
        await change(await request.form())
    except GatewayError as exc:
        await audit_refusal(gateway.admin, session.actor, action, exc)
        return await tenant_page(
            request, tenant_id, session, gateway, error=FormError.of(form_id, exc)
        )
    return RedirectResponse(_tenant_url(tenant_id, form_id), status_code=303)


@router.post("/{tenant_id}/settings")
async def update_tenant(
    request: Request, tenant_id: str, session: Mutation, gateway: GatewayDep
) -> Response:
    async def change(form: Any) -> None:
        body = model(
            schemas.TenantUpdate,
            {
                "name": text(form, "name"),
                "enabled": checkbox(form, "enabled"),
                "allow_base_model": checkbox(form, "allow_base_model"),
                "weight": optional_int(form, "weight"),
                "priority": text(form, "priority"),
                # Emptied, an objective goes back to its class's, as 0 does.
                "slo_ttft_ms": optional_int(form, "slo_ttft_ms") or 0,
                "slo_tpot_ms": optional_int(form, "slo_tpot_ms") or 0,
            },
        )
        await gateway.admin.update_tenant(session.actor, tenant_id, body)

    return await _mutate(request, tenant_id, session, gateway, "settings", "tenant.update", change)


@router.post("/{tenant_id}/keys")
async def create_key(
    request: Request, tenant_id: str, session: Mutation, gateway: GatewayDep
) -> Response:
    form = await request.form()
    try:
        body = model(schemas.KeyCreate, {"name": text(form, "name")})
        row, key = await gateway.admin.create_key(session.actor, tenant_id, body)
    except GatewayError as exc:
        await audit_refusal(gateway.admin, session.actor, "key.create", exc)
        return await tenant_page(
            request, tenant_id, session, gateway, error=FormError.of("keys", exc)
        )
    created = schemas.KeyCreated.model_validate(
        {**schemas.KeyOut.model_validate(row).model_dump(), "key": key}
    )
    # Shown in this answer only (never in a URL or a redirect): the page, with the key.
    return await tenant_page(request, tenant_id, session, gateway, created_key=created)


@router.post("/{tenant_id}/keys/{key_id}/revoke")
async def revoke_key(
    request: Request, tenant_id: str, key_id: str, session: Mutation, gateway: GatewayDep
) -> Response:
    async def change(_: Any) -> None:
        await gateway.admin.revoke_key(session.actor, tenant_id, key_id)

    return await _mutate(request, tenant_id, session, gateway, "keys", "key.revoke", change)


@router.post("/{tenant_id}/batches/{batch_id}/cancel")
async def cancel_batch(
    request: Request, tenant_id: str, batch_id: str, session: Mutation, gateway: GatewayDep
) -> Response:
    """Cancel one of the tenant's batches, as its own ``POST /v1/batches/{id}/cancel`` does."""

    async def change(_: Any) -> None:
        tenant = await gateway.admin.get_tenant(tenant_id)
        await gateway.batches.cancel_of(tenant.uid, batch_id)
        await gateway.admin.audit(session.actor, "batch.cancel", f"{tenant_id}/{batch_id}", "ok")

    return await _mutate(request, tenant_id, session, gateway, "batches", "batch.cancel", change)


def _quota(form: Any) -> schemas.QuotaPut:
    return model(
        schemas.QuotaPut,
        {
            name: optional_int(form, name)
            for name in (
                "requests_per_minute",
                "tokens_per_minute",
                "max_concurrent_requests",
                "token_budget",
            )
        }
        | {"budget_period": text(form, "budget_period")},
    )


@router.post("/{tenant_id}/quota")
async def put_quota(
    request: Request, tenant_id: str, session: Mutation, gateway: GatewayDep
) -> Response:
    async def change(form: Any) -> None:
        await gateway.admin.put_quota(session.actor, tenant_id, _quota(form))

    return await _mutate(request, tenant_id, session, gateway, "quota", "quota.put", change)


@router.post("/{tenant_id}/keys/{key_id}/quota")
async def put_key_quota(
    request: Request, tenant_id: str, key_id: str, session: Mutation, gateway: GatewayDep
) -> Response:
    async def change(form: Any) -> None:
        await gateway.admin.put_key_quota(session.actor, tenant_id, key_id, _quota(form))

    return await _mutate(request, tenant_id, session, gateway, "keys", "key.quota.put", change)


def _split(raw: str) -> dict[str, int] | None:
    """``3:90, 4:10`` as the REST API's ``versions``."""
    if not raw:
        return None
    try:
        pairs = [part.split(":") for part in raw.replace(" ", "").split(",") if part]
        return {version: int(weight) for version, weight in pairs}
    except ValueError:
        raise BadRequestError(
            "`versions`: write version:weight pairs, as 3:90, 4:10.", param="versions"
        ) from None


def _grant(form: Any) -> schemas.GrantPut:
    shadow_version = optional_int(form, "shadow_version")
    rollback = text(form, "rollback")
    try:
        # pydantic's parser bounds nesting (a refusal); the standard library's recurses into a
        # RecursionError on fifty thousand `[`.
        rule = from_json(rollback) if rollback else None
    except ValueError as exc:
        raise BadRequestError(f"`rollback`: not JSON ({exc}).", param="rollback") from None
    return model(
        schemas.GrantPut,
        {
            "adapter": text(form, "adapter"),
            "version": optional_int(form, "version"),
            "versions": _split(text(form, "versions")),
            "sticky": "user" if checkbox(form, "sticky") else "request",
            "shadow": (
                {"version": shadow_version, "percent": optional_int(form, "shadow_percent")}
                if shadow_version is not None
                else None
            ),
            "rollback": rule,
        },
    )


@router.post("/{tenant_id}/grants")
async def put_grant(
    request: Request, tenant_id: str, session: Mutation, gateway: GatewayDep
) -> Response:
    async def change(form: Any) -> None:
        alias = schemas.check_grant_alias(text(form, "alias"), gateway.registry.base_model_id)
        await gateway.admin.grants.put(session.actor, tenant_id, alias, _grant(form))

    return await _mutate(request, tenant_id, session, gateway, "grants", "grant.put", change)


@router.post("/{tenant_id}/grants/{alias}/rollback")
async def rollback_grant(
    request: Request, tenant_id: str, alias: str, session: Mutation, gateway: GatewayDep
) -> Response:
    async def change(form: Any) -> None:
        version = optional_int(form, "version")
        if version is None:
            raise BadRequestError("`version`: which version to roll back to.", param="version")
        body = model(schemas.GrantRollback, {"version": version})  # bounded as over REST
        await gateway.admin.grants.roll_back(session.actor, tenant_id, alias, body.version)

    return await _mutate(request, tenant_id, session, gateway, "grants", "grant.rollback", change)


@router.post("/{tenant_id}/grants/{alias}/delete")
async def delete_grant(
    request: Request, tenant_id: str, alias: str, session: Mutation, gateway: GatewayDep
) -> Response:
    async def change(_: Any) -> None:
        await gateway.admin.grants.delete(session.actor, tenant_id, alias)

    return await _mutate(request, tenant_id, session, gateway, "grants", "grant.delete", change)
