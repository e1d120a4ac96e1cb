"""Files where adapter versions are kept in object storage (LORA_GATEWAY_ADAPTER_STORE=s3://):
an upload lands in the bucket beside the adapters (under ``files/``), is read back from it,
a batch reads its input from it and writes its results to it, and a delete removes it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from app.tenancy.storage.s3 import S3Location, s3_client
from tests.support.batches import FAST_BATCHES, chat_line, finished, jsonl, read_jsonl
from tests.support.responses import client
from tests.support.s3_server import use_s3
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import ServeFactory


@pytest.fixture
def bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3Location:
    use_s3(monkeypatch, s3_endpoint)
    location = S3Location(f"files-{uuid.uuid4().hex}", "prod")
    s3_client().create_bucket(Bucket=location.bucket)
    return location


def keys(bucket: S3Location) -> set[str]:
    listed = s3_client().list_objects_v2(Bucket=bucket.bucket).get("Contents", [])
    return {item["Key"] for item in listed}


async def test_files_and_batch_results_live_in_the_bucket(
    serve: ServeFactory, bucket: S3Location, tmp_path: Path
) -> None:
    store = f"s3://{bucket.bucket}/{bucket.prefix}"
    settings = {"adapter_store": store, "adapter_cache_dir": tmp_path / "cache", **FAST_BATCHES}
    async with serve(ScriptedEngine(), **settings) as served:
        api = client(served)
        content = jsonl([chat_line(f"c-{i}", served.model, max_tokens=2) for i in range(3)])
        uploaded = await api.files.create(file=("in.jsonl", content), purpose="batch")
        assert keys(bucket) == {bucket.key(f"files/{uploaded.id}")}
        assert (await api.files.content(uploaded.id)).read() == content

        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        batch = await finished(api, batch.id)
        assert batch.status == "completed" and batch.output_file_id is not None
        assert bucket.key(f"files/{batch.output_file_id}") in keys(bucket)
        output = read_jsonl((await api.files.content(batch.output_file_id)).read())
        assert [line["custom_id"] for line in output] == ["c-0", "c-1", "c-2"]

        await api.files.delete(uploaded.id)
        assert keys(bucket) == {bucket.key(f"files/{batch.output_file_id}")}
        # Nothing of the uploads stays on this host.
        assert not any((served.gateway.files.spool).glob("*"))
