"""An adapter uploaded through the admin REST API with LORA_GATEWAY_ADAPTER_STORE=s3://...:
it lands in a real S3 server on loopback (moto's server mode); with the store down the
upload is a 503 in OpenAI's error shape and nothing is recorded."""

from __future__ import annotations

import fcntl
import os
import uuid
from pathlib import Path

import httpx
import pytest

from app.tenancy.storage.s3 import S3Location, s3_client
from tests.support.archives import tiny_adapter_archive
from tests.support.harness import ADMIN_TOKEN
from tests.support.s3_server import use_s3
from tests.support.scripted_engine import ScriptedEngine
from tests.support.servers import free_port
from tests.support.serving import TENANT, ServeFactory


async def upload(base_url: str, name: str, seed: int = 0) -> httpx.Response:
    async with httpx.AsyncClient(
        base_url=f"{base_url}/admin/v1",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=60,
    ) as admin:
        return await admin.post(
            "/adapters",
            data={"name": name},
            files={"file": ("adapter.tar.gz", tiny_adapter_archive(seed), "application/gzip")},
        )


@pytest.fixture
def bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3Location:
    """A new, empty bucket on the S3 server, which the gateway reaches through AWS_*."""
    use_s3(monkeypatch, s3_endpoint)
    location = S3Location(f"adapters-{uuid.uuid4().hex}", "prod")
    s3_client().create_bucket(Bucket=location.bucket)
    return location


async def test_an_uploaded_adapter_lands_in_the_bucket(
    serve: ServeFactory, bucket: S3Location, tmp_path: Path
) -> None:
    store = f"s3://{bucket.bucket}/{bucket.prefix}"

    async with serve(
        ScriptedEngine(), adapter_store=store, adapter_cache_dir=tmp_path / "cache"
    ) as served:
        response = await upload(served.base_url, "support")

    assert response.status_code == 201, response.text
    digest = response.json()["sha256"]
    listed = s3_client().list_objects_v2(Bucket=bucket.bucket)["Contents"]
    assert {item["Key"] for item in listed} == {
        bucket.content_key(digest, "adapter_config.json"),
        bucket.content_key(digest, "adapter_model.safetensors"),
        bucket.manifest_key(digest),
        bucket.version_key("support@v1"),
    }
    assert (tmp_path / "cache" / "sha256" / digest / "adapter_model.safetensors").is_file()


async def test_an_upload_with_the_store_down_is_a_503_and_records_nothing(
    serve: ServeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_s3(monkeypatch, f"http://127.0.0.1:{free_port()}")  # nothing listens there

    async with serve(
        ScriptedEngine(), adapter_store="s3://unreachable/prod", adapter_cache_dir=tmp_path / "c"
    ) as served:
        response = await upload(served.base_url, "support")
        registered = await served.admin("GET", "/adapters")

    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "adapter_storage_unavailable"
    assert set(error) == {"message", "type", "param", "code"}
    assert "unreachable" not in error["message"]  # the bucket is the operator's business
    assert registered == []
    assert not (tmp_path / "c" / "sha256").exists()


async def test_a_replica_that_never_saw_the_upload_serves_the_adapter_from_the_bucket(
    serve: ServeFactory, bucket: S3Location, tmp_path: Path
) -> None:
    """Two replicas share the store and the bucket, not a disk: the second fetches the
    adapter into its own cache before its engine loads it."""
    store = f"s3://{bucket.bucket}/{bucket.prefix}"

    async with serve(
        ScriptedEngine(), adapter_store=store, adapter_cache_dir=tmp_path / "cache-a"
    ) as first:
        digest = (await upload(first.base_url, "support")).json()["sha256"]
        await first.admin("PUT", f"/tenants/{TENANT}/adapters/support", {"adapter": "support"})

    engine = ScriptedEngine()
    second_replica = serve(engine, adapter_store=store, adapter_cache_dir=tmp_path / "cache-b")
    async with second_replica as second, second.client() as client:
        body = {"model": "support", "prompt": "hi", "max_tokens": 3}
        response = await client.post("/v1/completions", json=body)

    assert response.status_code == 200, response.text
    [request] = engine.started()
    assert request.adapter is not None and request.adapter.sha256 == digest
    assert request.adapter.path == tmp_path / "cache-b" / "sha256" / digest
    assert (request.adapter.path / "adapter_model.safetensors").read_bytes() == (
        tmp_path / "cache-a" / "sha256" / digest / "adapter_model.safetensors"
    ).read_bytes()


async def test_a_running_request_keeps_its_adapter_in_the_cache(
    serve: ServeFactory, bucket: S3Location, tmp_path: Path
) -> None:
    """The cache's bound evicts what no one uses; the adapter of a request still running is
    not evicted from under the engine, however small the bound."""
    store = f"s3://{bucket.bucket}/{bucket.prefix}"
    async with serve(
        ScriptedEngine(), adapter_store=store, adapter_cache_dir=tmp_path / "cache-a"
    ) as first:
        digests = {}
        for seed, name in enumerate(("support", "billing")):
            digests[name] = (await upload(first.base_url, name, seed)).json()["sha256"]
            await first.admin("PUT", f"/tenants/{TENANT}/adapters/{name}", {"adapter": name})

    cache = tmp_path / "cache-b" / "sha256"
    engine = ScriptedEngine(step_seconds=0.05)
    second_replica = serve(
        engine, adapter_store=store, adapter_cache_dir=tmp_path / "cache-b", adapter_cache_bytes=1
    )
    async with second_replica as second, second.client() as client:
        body = {"model": "support", "prompt": "hi", "max_tokens": 40, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as running:
            assert running.status_code == 200
            lines = running.aiter_lines()
            assert (await anext(lines)).startswith("data: {")
            # Another adapter's fetch must make room: the running request's entry stays.
            other = {"model": "billing", "prompt": "hi", "max_tokens": 1}
            assert (await client.post("/v1/completions", json=other)).status_code == 200
            assert (cache / digests["support"]).is_dir()
            assert not can_evict(tmp_path / "cache-b", digests["support"])
            async for _ in lines:  # to the end
                pass
        await second.settled()
        assert can_evict(tmp_path / "cache-b", digests["support"])  # let go once it ended


def can_evict(cache: Path, digest: str) -> bool:
    """Whether eviction could take ``digest``'s entry now (its lock, alone, without waiting)."""
    fd = os.open(cache / "locks" / f"{digest}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
