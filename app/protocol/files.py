"""OpenAI's Files API objects (docs/batches.md): what ``client.files.*`` reads."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.protocol.common import ObjectList

FilePurpose = Literal["batch", "batch_output"]


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int = Field(description="Unix seconds.")
    expires_at: int = Field(description="Unix seconds: deleted then (the retention setting).")
    filename: str
    purpose: FilePurpose
    status: Literal["processed"] = "processed"
    status_details: str | None = None


class FileList(ObjectList[FileObject]):
    pass


class DeletedFile(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: Literal[True] = True
