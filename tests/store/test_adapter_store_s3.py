"""Adapters in S3-compatible object storage, against a real S3 server on loopback (moto's
server mode): uploads through the admin service, the host cache another host fetches
through, and every way stored content can be wrong or unreachable."""

from __future__ import annotations

import json
import multiprocessing
import threading
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.admin.service import AdminService
from app.errors import EngineUnavailableError, NotFoundError
from app.settings import EMBEDDED_MODEL_DIR, Settings
from app.store.db import open_database
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.storage import LocalAdapterStore, S3AdapterStore, open_adapter_store
from app.tenancy.storage.cache import AdapterCache
from app.tenancy.storage.errors import (
    AdapterContentCorrupt,
    AdapterContentMissing,
    AdapterStorageUnavailable,
)
from app.tenancy.storage.s3 import S3Content, S3Location, s3_client
from bench.random_adapters import make_random_adapter
from tests.support.cold_load import cold_load
from tests.support.s3_server import use_s3
from tests.support.servers import free_port

ACTOR = "admin:test"
HANG_SECONDS = 300
"""Bounds only a hang: a verdict never rests on how long processes take to start or end."""


@pytest.fixture
def aws(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The standard AWS_* variables pointing boto3 at the loopback server."""
    use_s3(monkeypatch, s3_endpoint)
    return s3_endpoint


@pytest.fixture
def location(aws: str) -> S3Location:
    bucket = f"adapters-{uuid.uuid4().hex}"
    s3_client().create_bucket(Bucket=bucket)
    return S3Location(bucket, "gateway/adapters")


@pytest.fixture
def settings(tmp_path: Path, location: S3Location) -> Settings:
    return Settings(
        adapter_root=tmp_path / "adapters",
        adapter_store=f"s3://{location.bucket}/{location.prefix}",
        adapter_cache_dir=tmp_path / "host-a-cache",
        max_lora_rank=32,
    )


@pytest.fixture(scope="module")
def base_model() -> BaseModelInfo:
    return BaseModelInfo.from_model_dir(EMBEDDED_MODEL_DIR)


@pytest.fixture
async def admin(
    settings: Settings, base_model: BaseModelInfo, tmp_path: Path
) -> AsyncIterator[AdminService]:
    async def nothing() -> None:
        pass

    async with open_database(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}") as sessions:
        yield AdminService.from_settings(settings, sessions, base_model, on_change=nothing)


def adapter_dir(root: Path, name: str, seed: int = 1) -> Path:
    return make_random_adapter(
        EMBEDDED_MODEL_DIR, root / name, rank=8, target_modules=("q_proj", "v_proj"), seed=seed
    )


async def register(admin: AdminService, name: str, seed: int = 1) -> tuple[str, Path]:
    adapter_dir(admin.storage.root, name, seed)
    row = await admin.register_adapter(ACTOR, name, partial(admin.storage.from_path, name))
    return row.sha256, Path(row.path)


def keys(location: S3Location) -> set[str]:
    listed = s3_client().list_objects_v2(Bucket=location.bucket)
    return {item["Key"] for item in listed.get("Contents", [])}


def files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def count_calls(client: Any, operation: str) -> list[str]:
    """The keys of every ``operation`` the client sends, as it sends them."""
    seen: list[str] = []
    lock = threading.Lock()

    def record(params: dict[str, Any], **_: Any) -> None:
        with lock:
            seen.append(params["Key"])

    client.meta.events.register(f"provide-client-params.s3.{operation}", record)
    return seen


def cache_leftovers(cache: AdapterCache) -> list[Path]:
    """Everything under the cache but its lock files."""
    return [p for p in cache.root.rglob("*") if p.is_file() and p.parent.name != "locks"]


def test_the_setting_picks_the_store(tmp_path: Path, base_model: BaseModelInfo) -> None:
    local = open_adapter_store(Settings(adapter_root=tmp_path), base_model)
    assert type(local) is LocalAdapterStore
    remote = open_adapter_store(
        Settings(adapter_root=tmp_path, adapter_store="s3://my-bucket/a/b"), base_model
    )
    assert isinstance(remote, S3AdapterStore)
    assert remote.content.location == S3Location("my-bucket", "a/b")
    for wrong in ("http://bucket/x", "s3://", "s3://UPPER/x", "bucket/prefix"):
        with pytest.raises(ValidationError, match="adapter_store"):
            Settings(adapter_store=wrong)


async def test_a_registered_adapter_lands_in_the_bucket_with_its_manifest(
    admin: AdminService, settings: Settings, location: S3Location
) -> None:
    digest, path = await register(admin, "legal")

    prefix = f"{location.prefix}/sha256/{digest}"
    assert keys(location) == {
        f"{prefix}/adapter_config.json",
        f"{prefix}/adapter_model.safetensors",
        f"{prefix}.json",
        f"{location.prefix}/versions/legal@v1.json",
    }
    raw = s3_client().get_object(Bucket=location.bucket, Key=f"{prefix}.json")["Body"].read()
    manifest = json.loads(raw)
    assert manifest["sha256"] == digest
    source = admin.storage.root / "legal"
    assert [(f["name"], f["size"]) for f in manifest["files"]] == [
        (p.name, p.stat().st_size) for p in sorted(source.iterdir())
    ]
    # What the in-process engine loads: this host's cache copy, identical to the upload.
    assert path == (settings.adapter_cache_dir / "sha256" / digest).resolve()
    assert files(path) == files(source)


async def test_identical_content_is_uploaded_once(
    admin: AdminService, location: S3Location
) -> None:
    assert isinstance(admin.storage, S3AdapterStore)
    puts = count_calls(admin.storage.content.client, "PutObject")
    first, _ = await register(admin, "legal")
    second, _ = await register(admin, "legal-copy")
    assert first == second
    content = [key for key in puts if "/sha256/" in key]
    assert len(content) == 3  # two files and the manifest, once


async def test_another_host_fetches_the_content_by_digest(
    admin: AdminService, location: S3Location, tmp_path: Path
) -> None:
    digest, path = await register(admin, "legal")
    other_host = AdapterCache(tmp_path / "host-b-cache", max_bytes=1 << 30)

    fetched = other_host.fetch(digest, S3Content(location))

    assert fetched == tmp_path / "host-b-cache" / "sha256" / digest
    assert files(fetched) == files(path)
    assert not list((other_host.root / "tmp").iterdir())


async def test_versions_are_named_in_the_bucket_once_recorded(
    admin: AdminService, location: S3Location
) -> None:
    """A host without the database finds which content ``name@vN`` is."""
    content = S3Content(location)
    first, _ = await register(admin, "legal", seed=1)
    second, _ = await register(admin, "legal", seed=2)
    assert first != second
    assert content.version_digest("legal@v1") == first
    assert content.version_digest("legal@v2") == second
    with pytest.raises(AdapterContentMissing, match="legal@v3"):
        content.version_digest("legal@v3")
    with pytest.raises(AdapterContentMissing):
        content.version_digest("../sha256/x")

    # A record lost (publishing failed after the commit) comes back when the same content
    # is registered again.
    s3_client().delete_object(Bucket=location.bucket, Key=location.version_key("legal@v2"))
    assert (await register(admin, "legal", seed=2))[0] == second
    assert content.version_digest("legal@v2") == second


async def test_a_store_on_another_host_makes_its_local_copy_from_the_bucket(
    admin: AdminService, settings: Settings, base_model: BaseModelInfo, tmp_path: Path
) -> None:
    digest, path = await register(admin, "legal")
    other_cache = tmp_path / "host-b-cache"
    other_host = open_adapter_store(
        settings.model_copy(update={"adapter_cache_dir": other_cache}), base_model
    )

    copy = other_host.local_copy(digest)

    assert copy == other_cache / "sha256" / digest
    assert files(copy) == files(path)
    assert admin.storage.local_copy(digest) == path  # this host already holds it
    with pytest.raises(AdapterContentMissing):
        other_host.local_copy("1" * 64)


def test_the_local_store_names_only_what_it_holds(
    tmp_path: Path, base_model: BaseModelInfo
) -> None:
    store = LocalAdapterStore(tmp_path, base_model, max_rank=32, max_bytes=1 << 30)
    adapter_dir(tmp_path, "legal")
    checked, path = store.from_path("legal")
    assert store.local_copy(checked.sha256) == path
    for unknown in ("0" * 64, "..", "../legal", "legal"):
        with pytest.raises(AdapterContentMissing):
            store.local_copy(unknown)


async def test_concurrent_cold_fetches_on_one_host_download_once(
    admin: AdminService, location: S3Location, tmp_path: Path
) -> None:
    digest, path = await register(admin, "legal")
    content = S3Content(location)
    gets = count_calls(content.client, "GetObject")
    start = threading.Barrier(8)

    def cold_load(_: int) -> Path:
        # One cache object per caller, as each engine process would have its own.
        cache = AdapterCache(tmp_path / "host-b-cache", max_bytes=1 << 30)
        start.wait()
        return cache.fetch(digest, content)

    with ThreadPoolExecutor(8) as pool:
        fetched = set(pool.map(cold_load, range(8)))

    assert len(fetched) == 1
    assert files(fetched.pop()) == files(path)
    assert sorted(gets) == sorted(
        [
            f"{location.prefix}/sha256/{digest}.json",
            f"{location.prefix}/sha256/{digest}/adapter_config.json",
            f"{location.prefix}/sha256/{digest}/adapter_model.safetensors",
        ]
    )


async def test_concurrent_cold_loads_by_eight_processes_download_once(
    admin: AdminService, location: S3Location, tmp_path: Path
) -> None:
    """As eight engine processes of one host would: each its own client and cache object.
    They are forked from this one, which has what they import imported already (eight new
    interpreters importing boto3 and the cache took several seconds of CPU); the cache's
    locks are taken in each process, on files none of them had open before."""
    digest, path = await register(admin, "legal")
    fork = multiprocessing.get_context("fork")
    start, results = fork.Barrier(8), fork.Queue()
    cache_root = tmp_path / "host-b-cache"
    loaders = [
        fork.Process(target=cold_load, args=(cache_root, location, digest, start, results))
        for _ in range(8)
    ]
    for loader in loaders:
        loader.start()
    outcomes = [results.get(timeout=HANG_SECONDS) for _ in loaders]
    for loader in loaders:
        loader.join(timeout=HANG_SECONDS)
        assert loader.exitcode == 0

    assert {fetched for fetched, _ in outcomes} == {cache_root / "sha256" / digest}
    assert files(cache_root / "sha256" / digest) == files(path)
    gets = sorted(key for _, keys in outcomes for key in keys)
    assert gets == sorted(
        [
            location.manifest_key(digest),
            location.content_key(digest, "adapter_config.json"),
            location.content_key(digest, "adapter_model.safetensors"),
        ]
    )


@pytest.mark.parametrize("same_size", [True, False])
async def test_a_corrupted_object_is_refused_and_leaves_nothing(
    admin: AdminService, location: S3Location, tmp_path: Path, same_size: bool
) -> None:
    digest, path = await register(admin, "legal")
    weights = (path / "adapter_model.safetensors").read_bytes()
    tampered = weights[:-1] + bytes([weights[-1] ^ 1]) if same_size else weights + b"\0"
    key = f"{location.prefix}/sha256/{digest}/adapter_model.safetensors"
    s3_client().put_object(Bucket=location.bucket, Key=key, Body=tampered)
    other_host = AdapterCache(tmp_path / "host-b-cache", max_bytes=1 << 30)

    with pytest.raises(AdapterContentCorrupt, match=r"adapter_model\.safetensors") as refused:
        other_host.fetch(digest, S3Content(location))

    assert isinstance(refused.value, EngineUnavailableError)
    assert refused.value.status_code == 503
    assert location.bucket not in refused.value.message
    assert cache_leftovers(other_host) == []
    assert not other_host.path(digest).exists()


async def test_a_missing_object_is_refused_and_leaves_nothing(
    admin: AdminService, location: S3Location, tmp_path: Path
) -> None:
    digest, _ = await register(admin, "legal")
    key = f"{location.prefix}/sha256/{digest}/adapter_model.safetensors"
    s3_client().delete_object(Bucket=location.bucket, Key=key)
    other_host = AdapterCache(tmp_path / "host-b-cache", max_bytes=1 << 30)

    missing = r"adapter_model\.safetensors of sha256:\w+ is missing"
    with pytest.raises(AdapterContentMissing, match=missing) as e:
        other_host.fetch(digest, S3Content(location))

    assert isinstance(e.value, NotFoundError) and e.value.status_code == 404
    assert cache_leftovers(other_host) == []
    with pytest.raises(AdapterContentMissing, match="No stored content"):
        other_host.fetch("0" * 64, S3Content(location))
    with pytest.raises(AdapterContentMissing, match="not a sha256"):
        other_host.fetch("../../etc", S3Content(location))


async def test_content_without_its_manifest_is_not_served(
    admin: AdminService, location: S3Location, tmp_path: Path
) -> None:
    """An upload that stopped before its manifest (written last) is invisible."""
    digest, _ = await register(admin, "legal")
    s3_client().delete_object(Bucket=location.bucket, Key=f"{location.prefix}/sha256/{digest}.json")
    other_host = AdapterCache(tmp_path / "host-b-cache", max_bytes=1 << 30)
    with pytest.raises(AdapterContentMissing):
        other_host.fetch(digest, S3Content(location))
    assert cache_leftovers(other_host) == []


async def test_the_cache_stays_under_its_bound_evicting_the_least_recently_used(
    admin: AdminService, location: S3Location, tmp_path: Path
) -> None:
    digests = [(await register(admin, f"a{seed}", seed))[0] for seed in range(4)]
    size = sum(p.stat().st_size for p in (admin.storage.root / "a0").iterdir())
    cache = AdapterCache(tmp_path / "host-b-cache", max_bytes=int(size * 2.5))
    content = S3Content(location)

    first, second, third, fourth = digests
    cache.fetch(first, content)
    cache.fetch(second, content)
    cache.fetch(first, content)  # used again: now the second is the least recent
    cache.fetch(third, content)
    assert cache.path(first).is_dir() and cache.path(third).is_dir()
    assert not cache.path(second).exists()
    assert cache.size_bytes() <= cache.max_bytes

    with cache.open(first, content):  # in use: never evicted, whatever its age
        cache.fetch(second, content)
        cache.fetch(fourth, content)
        assert cache.path(first).is_dir()
    assert cache.size_bytes() <= cache.max_bytes
    assert {p.parent.name for p in cache_leftovers(cache)} == {first, fourth}
    assert list((cache.root / "tmp").iterdir()) == []


async def test_an_unreachable_store_refuses_registration_with_503_and_keeps_nothing(
    base_model: BaseModelInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_s3(monkeypatch, f"http://127.0.0.1:{free_port()}")  # nobody there
    settings = Settings(
        adapter_root=tmp_path / "adapters",
        adapter_store="s3://down/adapters",
        adapter_cache_dir=tmp_path / "cache",
    )

    async def nothing() -> None:
        pass

    async with open_database(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}") as sessions:
        admin = AdminService.from_settings(settings, sessions, base_model, on_change=nothing)
        with pytest.raises(AdapterStorageUnavailable, match="cannot be reached") as refused:
            await register(admin, "legal")
        assert refused.value.status_code == 503
        assert await admin.list_adapter_versions() == []
    assert list((settings.adapter_root / ".store").iterdir()) == []
    assert not (settings.adapter_cache_dir / "sha256").exists()
