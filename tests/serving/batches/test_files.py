"""The Files API through the real app over a scripted engine, as the official ``openai``
client calls it: upload, list (paged), retrieve, download and delete, each answer read
strictly into the SDK's own types; another tenant's file is a 404 exactly like an unknown
one; the size, line and storage limits; and expired files purged from storage and store."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest
from openai.types import FileDeleted, FileObject

from app.api import responses as responses_api
from tests.support.responses import client
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, Served, ServeFactory

OTHER = "tenant-b"


def jsonl(count: int) -> bytes:
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
        for i in range(count)
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def strict_file(answer: Any) -> FileObject:
    return FileObject.model_validate(answer.to_dict())


async def other_client(served: Served) -> openai.AsyncOpenAI:
    await served.admin("POST", "/tenants", {"id": OTHER, "name": "B", "allow_base_model": True})
    key = (await served.admin("POST", f"/tenants/{OTHER}/keys", {"name": "k"}))["key"]
    return openai.AsyncOpenAI(base_url=f"{served.base_url}/v1", api_key=key, max_retries=0)


async def test_a_file_is_uploaded_listed_read_and_deleted(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served:
        files = client(served).files
        content = jsonl(3)
        created = strict_file(await files.create(file=("in.jsonl", content), purpose="batch"))
        assert (created.bytes, created.filename, created.purpose) == (
            len(content),
            "in.jsonl",
            "batch",
        )
        assert created.expires_at is not None and created.expires_at > created.created_at
        assert strict_file(await files.retrieve(created.id)) == created
        assert (await files.content(created.id)).read() == content

        # Listed newest first, paged by `after`.
        second = await files.create(file=("b.jsonl", jsonl(1)), purpose="batch")
        first_page = await files.list(limit=1)
        assert [f.id for f in first_page.data] == [second.id] and first_page.has_more
        rest = await files.list(limit=1, after=second.id)
        assert [f.id for f in rest.data] == [created.id] and not rest.has_more
        oldest_first = await files.list(order="asc")
        assert [f.id for f in oldest_first.data] == [created.id, second.id]

        deleted = FileDeleted.model_validate((await files.delete(created.id)).to_dict())
        assert deleted.deleted and deleted.id == created.id
        with pytest.raises(openai.NotFoundError):
            await files.retrieve(created.id)
        assert not any(served.gateway.files.spool.glob("*")), "nothing left spooled"


async def test_another_tenants_file_is_a_404_like_an_unknown_one(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served:
        mine = await client(served).files.create(file=("a.jsonl", jsonl(1)), purpose="batch")
        theirs = (await other_client(served)).files
        answers = []
        for file_id in (mine.id, "file-" + "0" * 32):
            for call in (theirs.retrieve, theirs.content, theirs.delete):
                with pytest.raises(openai.NotFoundError) as refused:
                    await call(file_id)
                body = refused.value.body
                assert isinstance(body, dict)
                answers.append(body["message"].replace(file_id, "<id>"))
        assert len(set(answers)) == 1
        assert (await theirs.list()).data == []
        # Still there for its tenant.
        assert (await client(served).files.content(mine.id)).read() == jsonl(1)


async def test_the_size_and_line_limits_are_refused_naming_them(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(), max_file_bytes=4096, max_file_lines=5) as served:
        files = client(served).files
        with pytest.raises(openai.APIStatusError) as too_large:
            await files.create(file=("big.jsonl", b"x" * 5000), purpose="batch")
        assert too_large.value.status_code == 413
        assert "limit of 4096 bytes (the gateway's `max_file_bytes`)" in too_large.value.message
        with pytest.raises(openai.BadRequestError) as too_long:
            await files.create(file=("long.jsonl", jsonl(6)), purpose="batch")
        assert "at most 5 (the gateway's `max_file_lines`)" in too_long.value.message
        with pytest.raises(openai.BadRequestError) as wrong_purpose:
            await files.create(file=("a.jsonl", jsonl(1)), purpose="fine-tune")
        assert wrong_purpose.value.param == "purpose"  # type: ignore[attr-defined]
        assert (await files.list()).data == []


async def test_files_above_max_request_bytes_are_accepted(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(), max_request_bytes=1 << 16) as served:
        content = jsonl(2) + b" " * (1 << 17)
        created = await client(served).files.create(file=("a.jsonl", content), purpose="batch")
        assert created.bytes == len(content)


async def test_the_storage_cap_counts_files_and_stored_responses(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each check on a fresh reading of the room (one seen: tests/store/test_batch_store.py).
    monkeypatch.setattr(responses_api, "ROOM_MAX_AGE", 0.0)
    async with serve(ScriptedEngine(last_finish_reason="stop")) as served:
        await served.admin("PUT", f"/tenants/{TENANT}/quota", {"storage_bytes": 1500})
        assert (await served.admin("GET", f"/tenants/{TENANT}/quota"))["storage_bytes"] == 1500
        api = client(served)
        await api.files.create(file=("a.jsonl", b"x" * 1000), purpose="batch")
        with pytest.raises(openai.APIStatusError) as too_big:  # a 413, as a file's other limits
            await api.files.create(file=("b.jsonl", b"x" * 1000), purpose="batch")
        assert too_big.value.status_code == 413
        assert too_big.value.body["param"] == "storage_bytes"  # type: ignore[index]
        assert "storage_bytes" in too_big.value.message
        # A stored response counts too: past the cap, `store: true` is refused before it runs.
        await api.responses.create(model=served.model, input="hi", max_output_tokens=2)
        await served.gateway.responses.written()
        used = await served.gateway.files.store.storage_used(
            served.gateway.registry.tenant(TENANT).uid
        )  # type: ignore[union-attr]
        assert used > 1000
        await served.admin("PUT", f"/tenants/{TENANT}/quota", {"storage_bytes": 1001})
        with pytest.raises(openai.RateLimitError) as refused:
            await api.responses.create(model=served.model, input="hi", max_output_tokens=2)
        assert "storage_bytes" in refused.value.message
        await served.settled()
        assert len(await served.usage_records()) == 1, "the refused response never ran"
        # Unstored responses are not capped.
        await api.responses.create(model=served.model, input="hi", max_output_tokens=2, store=False)


async def test_expired_files_are_purged_from_storage_and_store(serve: ServeFactory) -> None:
    retention = timedelta(milliseconds=50)
    async with serve(ScriptedEngine(), file_retention_days=retention / timedelta(days=1)) as served:
        files = served.gateway.files
        created = await client(served).files.create(file=("a.jsonl", jsonl(1)), purpose="batch")
        kept = files.contents.root / created.id  # type: ignore[attr-defined]
        assert kept.is_file()
        await asyncio.sleep(retention.total_seconds())
        # Expired: not found, before the purge as after it.
        with pytest.raises(openai.NotFoundError):
            await client(served).files.retrieve(created.id)
        assert await files.purge() == 1
        assert not kept.exists()
        assert await files.store.expired() == []


async def test_an_upload_must_be_multipart_with_a_file(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as http:
        answer = await http.post("/v1/files", json={"purpose": "batch"})
        assert answer.status_code == 400
        answer = await http.post("/v1/files", data={"purpose": "batch"}, files={})
        assert answer.status_code == 400
        assert isinstance(answer, httpx.Response)


async def test_concurrent_uploads_never_pass_the_storage_cap_together(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served:
        await served.admin("PUT", f"/tenants/{TENANT}/quota", {"storage_bytes": 1000})
        api = client(served)

        async def upload(n: int) -> FileObject | None:
            try:
                return await api.files.create(file=(f"{n}.jsonl", b"x" * 600), purpose="batch")
            except openai.APIStatusError as refused:
                assert refused.status_code == 413 and "storage_bytes" in refused.message
                return None

        kept = [f for f in await asyncio.gather(*(upload(n) for n in range(4))) if f is not None]
        assert len(kept) == 1, "each upload fits alone, no two together"
        tenant = served.gateway.registry.tenant(TENANT)
        assert tenant is not None
        assert await served.gateway.files.store.storage_used(tenant.uid) == 600
