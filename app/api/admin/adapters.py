"""``/admin/v1/adapters``: register (by path or upload), list, delete; where each version
resides in the engine (tier, use, swap cost)."""

from __future__ import annotations

import asyncio
import tempfile
from functools import partial
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile

from app.admin import schemas
from app.admin.residency_report import Residency, read_residency
from app.admin.service import AdminService
from app.api.admin.deps import Admin, AdminActor
from app.api.deps import GatewayDep
from app.errors import BadRequestError, NotFoundError, RequestTooLargeError
from app.protocol import INT64_MAX
from app.store.snapshot import adapter_of
from app.store.tables import AdapterVersionRow

router = APIRouter(prefix="/adapters", tags=["admin: adapters"])

UPLOAD_CHUNK = 1 << 20
RESIDENCY_IN_ENGINES = (
    "This replica forwards requests to engine pods: each reports its adapters' residency on "
    "its own /metrics (lora_gateway_adapter_tier)."
)
REGISTER_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": schemas.AdapterRegister.model_json_schema(),
                "example": {"name": "legal_advisor", "path": "legal_advisor"},
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["name", "file"],
                    "properties": {
                        "name": {"type": "string", "pattern": schemas.ADAPTER_NAME_PATTERN},
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": ".zip or .tar.gz of a PEFT LoRA adapter directory",
                        },
                    },
                }
            },
        },
    }
}


def _version(row: AdapterVersionRow) -> schemas.AdapterVersionOut:
    return schemas.AdapterVersionOut.model_validate(row, from_attributes=True)


async def spool_upload(upload: UploadFile, limit: int) -> Path:
    """The upload in a temporary file; refused once it exceeds ``limit`` bytes."""
    handle = tempfile.NamedTemporaryFile(prefix="adapter-upload-", delete=False)  # noqa: SIM115
    size = 0
    with handle:
        while chunk := await upload.read(UPLOAD_CHUNK):
            size += len(chunk)
            if size > limit:
                handle.close()
                Path(handle.name).unlink()
                raise RequestTooLargeError(
                    limit, what="The adapter archive", param="file", setting="max_adapter_bytes"
                )
            handle.write(chunk)
    return Path(handle.name)


async def register_upload(
    admin: AdminService, actor: str, form: FormData, max_bytes: int
) -> AdapterVersionRow:
    """A new version from a multipart form's ``name`` and ``file`` (an archive), as the admin
    API and the console's upload form send them; the spooled archive goes once it is stored."""
    upload, name = form.get("file"), form.get("name")
    if not isinstance(upload, UploadFile):
        raise BadRequestError("Multipart field `file` (the archive) is required.", param="file")
    try:
        body = schemas.AdapterRegister(name=str(name or ""), path=".")
    except ValidationError as exc:
        message = f"Invalid adapter name: {exc.errors()[0]['msg']}"
        raise BadRequestError(message, param="name") from exc
    archive = await spool_upload(upload, max_bytes)
    try:
        store = partial(admin.storage.from_archive, archive, upload.filename or "")
        return await admin.register_adapter(actor, body.name, store)
    finally:
        await asyncio.to_thread(archive.unlink)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=schemas.AdapterVersionOut,
    openapi_extra=REGISTER_BODY,
)
async def register_adapter(
    request: Request, admin: Admin, actor: AdminActor, gateway: GatewayDep
) -> object:
    """Register a new immutable version from a directory under the adapter root
    (JSON) or from an uploaded archive (multipart: ``name``, ``file``)."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form()
        row = await register_upload(admin, actor, form, gateway.settings.max_adapter_bytes)
    else:
        try:
            body = schemas.AdapterRegister.model_validate_json(await request.body())
        except ValidationError as exc:
            error = exc.errors()[0]
            param = ".".join(str(p) for p in error["loc"]) or None
            raise BadRequestError(f"Invalid request: {error['msg']}", param=param) from exc
        store = partial(admin.storage.from_path, body.path)
        row = await admin.register_adapter(actor, body.name, store)
    return _version(row)


@router.get("", response_model=list[schemas.AdapterOut])
async def list_adapters(
    admin: Admin,
    response: Response,
    q: Annotated[str, Query(max_length=100, description="name contains (any case)")] = "",
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[int | None, Query(ge=1, le=1000, description="default: all")] = None,
) -> object:
    """Adapters by name, each with its versions; ``X-Total-Count`` is how many match ``q``."""
    page = await admin.adapters_page(q, offset, limit)
    response.headers["X-Total-Count"] = str(page.total)
    return [
        schemas.AdapterOut(
            name=a.name,
            latest_version=a.latest.version,
            versions=[_version(row) for row in a.versions],
        )
        for a in page.items
    ]


# Before "/{name}": /adapters/residency is not an adapter named "residency".
@router.get("/residency", response_model=list[schemas.AdapterResidencyOut])
async def adapter_residency(request: Request, admin: Admin, gateway: GatewayDep) -> object:
    """Where each version is in this process's engine; a 404 in the front role, whose engines
    (other pods) report it on their own /metrics."""
    if not gateway.backends.holds_adapter_copies:
        raise NotFoundError(RESIDENCY_IN_ENGINES)
    metrics_dir = getattr(request.app.state, "metrics_dir", None)
    measured = await asyncio.to_thread(read_residency, metrics_dir)
    listed = []
    for row in await admin.list_adapter_versions():
        facts = measured.get((row.name, str(row.version)), Residency())
        listed.append(
            schemas.AdapterResidencyOut(
                name=row.name,
                version=row.version,
                tier=facts.tier or "storage",
                last_used_at=gateway.tracker.last_used.get(row.id),
                uses=facts.uses,
                hits=facts.uses["device"],
                misses=facts.uses["storage"],
                mean_swap_ms=facts.mean_swap_ms(),
            )
        )
    return listed


@router.get("/{name}", response_model=schemas.AdapterOut)
async def get_adapter(name: str, admin: Admin) -> object:
    versions = [_version(row) for row in await admin.list_adapter_versions(name)]
    return schemas.AdapterOut(name=name, latest_version=versions[-1].version, versions=versions)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_adapter(
    name: str,
    admin: Admin,
    actor: AdminActor,
    gateway: GatewayDep,
    force: Annotated[bool, Query(description="Also revoke every grant of it.")] = False,
) -> Response:
    """Delete every version; refused (409) while granted unless ``force``. The
    engine frees its slots once the requests already running with it finish."""
    retire_removed(await admin.delete_adapter(actor, name, force), admin, gateway)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.delete("/{name}/versions/{version}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_adapter_version(
    name: str, version: int, admin: Admin, actor: AdminActor, gateway: GatewayDep
) -> Response:
    """Delete one version; refused (409, naming the aliases) while a grant serves it."""
    retire_removed([await admin.delete_adapter_version(actor, name, version)], admin, gateway)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def retire_removed(removed: list[AdapterVersionRow], admin: Admin, gateway: GatewayDep) -> None:
    """Once the response is sent: the engine frees the versions' slots, then their files
    go unless another version has the same content."""

    async def retire() -> None:
        await gateway.retire(adapter_of(row) for row in removed)
        await admin.forget_files(removed)

    gateway.background(retire())
