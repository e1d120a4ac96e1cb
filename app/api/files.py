"""OpenAI's Files API under ``/v1/files`` (docs/batches.md): a tenant's batch input files,
and the results its batches produce."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import iterate_in_threadpool
from starlette.datastructures import UploadFile

from app.api.deps import CurrentPrincipal, GatewayDep
from app.api.openai import ERROR_RESPONSES
from app.errors import BadRequestError
from app.protocol.files import DeletedFile, FileList, FileObject
from app.store.tables import FileRow

router = APIRouter(prefix="/v1", tags=["openai: files"])

UPLOAD_CHUNK = 1 << 20
UPLOAD_PURPOSES = ("batch",)
UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["purpose", "file"],
                    "properties": {
                        "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES)},
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "JSONL: one batch request a line",
                        },
                    },
                }
            }
        },
    }
}


def _unix(moment: datetime) -> int:
    return int(moment.timestamp())


def file_object(row: FileRow) -> FileObject:
    return FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=_unix(row.created_at),
        expires_at=_unix(row.expires_at),
        filename=row.filename,
        purpose=row.purpose,
    )


async def _chunks(upload: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await upload.read(UPLOAD_CHUNK):
        yield chunk


@router.post(
    "/files", response_model=FileObject, responses=ERROR_RESPONSES, openapi_extra=UPLOAD_BODY
)
async def upload_file(
    request: Request, gateway: GatewayDep, principal: CurrentPrincipal
) -> FileObject:
    """Upload a file (multipart: ``purpose``, ``file``). Its size is bounded by
    ``max_file_bytes``, not by ``max_request_bytes``."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise BadRequestError("Upload a file as multipart/form-data.", param="file")
    async with request.form(max_files=1, max_fields=10) as form:
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose not in UPLOAD_PURPOSES:
            raise BadRequestError(
                f"`purpose` must be one of {', '.join(UPLOAD_PURPOSES)}; got {purpose!r:.60}.",
                param="purpose",
            )
        if not isinstance(upload, UploadFile):
            raise BadRequestError("Multipart field `file` is required.", param="file")
        filename = (upload.filename or "upload.jsonl")[:255]
        row = await gateway.files.upload(principal.tenant, filename, str(purpose), _chunks(upload))
    return file_object(row)


@router.get("/files", response_model=FileList, responses=ERROR_RESPONSES)
async def list_files(
    gateway: GatewayDep,
    principal: CurrentPrincipal,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> FileList:
    found = await gateway.files.page(
        principal.tenant, after=after, limit=limit, order=order, purpose=purpose
    )
    return FileList(data=[file_object(row) for row in found.files], has_more=found.has_more)


@router.get("/files/{file_id}", response_model=FileObject, responses=ERROR_RESPONSES)
async def retrieve_file(file_id: str, gateway: GatewayDep, principal: CurrentPrincipal) -> Any:
    return file_object(await gateway.files.get(principal.tenant, file_id))


@router.get(
    "/files/{file_id}/content",
    responses={**ERROR_RESPONSES, 200: {"content": {"application/octet-stream": {}}}},
)
async def retrieve_file_content(
    file_id: str, gateway: GatewayDep, principal: CurrentPrincipal
) -> Response:
    """The file's bytes, streamed from storage."""
    row = await gateway.files.get(principal.tenant, file_id)
    chunks = gateway.files.chunks(row)
    # The first chunk before the response starts: content gone from storage is a 404.
    first = await anext(iterate_in_threadpool(chunks), b"")
    return StreamingResponse(
        _after(first, iterate_in_threadpool(chunks)),
        media_type="application/octet-stream",
        headers={"content-length": str(row.bytes)},
    )


async def _after(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


@router.delete("/files/{file_id}", response_model=DeletedFile, responses=ERROR_RESPONSES)
async def delete_file(
    file_id: str, gateway: GatewayDep, principal: CurrentPrincipal
) -> DeletedFile:
    await gateway.files.delete(principal.tenant, file_id)
    return DeletedFile(id=file_id)
