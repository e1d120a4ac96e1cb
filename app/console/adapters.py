"""Adapters: the searchable list with the upload form, and each adapter's page (versions,
residency, deletion), through the admin service as the REST API does."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from app.admin.residency_report import Residency, read_residency
from app.admin.sessions import ConsoleSession
from app.api.admin.adapters import register_upload, retire_removed
from app.api.deps import GatewayDep
from app.console.auth import Mutation, Session
from app.console.forms import FormError, audit_refusal, checkbox
from app.console.rendering import CONSOLE_PREFIX, ConsoleRoute, page
from app.errors import GatewayError, NotFoundError
from app.gateway import Gateway
from app.protocol import INT64_MAX

router = APIRouter(prefix="/adapters", route_class=ConsoleRoute)

PAGE_SIZE = 50


@router.get("")
async def adapters(
    request: Request,
    session: Session,
    gateway: GatewayDep,
    q: str = Query("", max_length=100),
    offset: int = Query(0, ge=0, le=INT64_MAX),
) -> Response:
    return await adapters_page(request, session, gateway, q=q, offset=offset)


async def adapters_page(
    request: Request,
    session: ConsoleSession,
    gateway: Gateway,
    *,
    q: str = "",
    offset: int = 0,
    error: FormError | None = None,
) -> Response:
    listed = await gateway.admin.adapters_page(q, offset, PAGE_SIZE)
    return page(
        request,
        "adapters.html",
        session,
        status=error.status if error else 200,
        listed=listed,
        q=q,
        error=error,
        max_bytes=gateway.settings.max_adapter_bytes,
    )


def _wants_json(request: Request) -> bool:
    """The console's script uploads with a progress bar and asks for JSON; a browser without
    script posts the form and gets a page."""
    return "application/json" in request.headers.get("accept", "")


@router.post("")
async def upload(request: Request, session: Mutation, gateway: GatewayDep) -> Response:
    """A new version from an uploaded archive (``name``, ``file``), validated as over REST;
    a refusal is shown next to the form with the validator's reason."""
    admin = gateway.admin
    form = await request.form()
    try:
        row = await register_upload(admin, session.actor, form, gateway.settings.max_adapter_bytes)
    except GatewayError as exc:
        await audit_refusal(admin, session.actor, "adapter.register", exc)
        if _wants_json(request):
            return JSONResponse(exc.body(), status_code=exc.status_code)
        return await adapters_page(request, session, gateway, error=FormError.of("upload", exc))
    url = f"{CONSOLE_PREFIX}/adapters/{row.name}?notice=uploaded"
    if _wants_json(request):
        return JSONResponse({"redirect": url}, status_code=201)
    return RedirectResponse(url, status_code=303)


@router.get("/{name}")
async def adapter(
    request: Request, name: str, session: Session, gateway: GatewayDep, notice: str = ""
) -> Response:
    return await adapter_page(request, name, session, gateway, notice=notice)


async def adapter_page(
    request: Request,
    name: str,
    session: ConsoleSession,
    gateway: Gateway,
    *,
    notice: str = "",
    error: FormError | None = None,
) -> Response:
    versions = await gateway.admin.list_adapter_versions(name)
    if not versions:
        raise NotFoundError(f"No adapter `{name}`.")
    residency = None
    if gateway.backends.holds_adapter_copies:  # the engine is in this process
        measured = await asyncio.to_thread(read_residency, request.app.state.metrics_dir)
        residency = {
            v.version: measured.get((v.name, str(v.version)), Residency()) for v in versions
        }
    return page(
        request,
        "adapter.html",
        session,
        status=error.status if error else 200,
        name=name,
        versions=versions,
        residency=residency,
        last_used={v.version: gateway.tracker.last_used.get(v.id) for v in versions},
        notice=notice,
        error=error,
    )


@router.post("/{name}/delete")
async def delete_adapter(
    request: Request, name: str, session: Mutation, gateway: GatewayDep
) -> Response:
    force = checkbox(await request.form(), "force")
    try:
        removed = await gateway.admin.delete_adapter(session.actor, name, force)
    except GatewayError as exc:
        return await adapter_page(
            request, name, session, gateway, error=FormError.of("delete", exc)
        )
    retire_removed(removed, gateway.admin, gateway)
    return RedirectResponse(f"{CONSOLE_PREFIX}/adapters?notice=deleted", status_code=303)


@router.post("/{name}/versions/{version}/delete")
async def delete_version(
    request: Request, name: str, version: int, session: Mutation, gateway: GatewayDep
) -> Response:
    try:
        removed = await gateway.admin.delete_adapter_version(session.actor, name, version)
    except GatewayError as exc:
        return await adapter_page(
            request, name, session, gateway, error=FormError.of("delete", exc)
        )
    retire_removed([removed], gateway.admin, gateway)
    return RedirectResponse(f"{CONSOLE_PREFIX}/adapters/{name}?notice=deleted", status_code=303)
