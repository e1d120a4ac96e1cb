"""The engine role's LoRA resolver, called as vLLM's server calls it, against a real S3 server
on loopback (moto's server mode) and against the local-directory store with its database."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from functools import partial
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from vllm.exceptions import GracefulHTTPError
from vllm.lora.resolver import LoRAResolverRegistry

from app.admin.service import AdminService
from app.engine_role import lora_resolver
from app.engine_role.lora_resolver import RESOLVER_NAME, StoreLoRAResolver
from app.settings import EMBEDDED_MODEL_DIR, Settings
from app.store.db import open_database
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.storage.cache import AdapterCache
from app.tenancy.storage.s3 import S3Content, S3Location, s3_client
from bench.random_adapters import make_random_adapter
from tests.support.adapter_dirs import publish_unchecked, with_config
from tests.support.s3_server import use_s3
from tests.support.servers import free_port

BASE = "models/SmolLM2-135M-Instruct"  # what vLLM passes: its model_config.model


@pytest.fixture
def aws(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    use_s3(monkeypatch, s3_endpoint)
    return s3_endpoint


def front_settings(tmp_path: Path, store: str = "") -> Settings:
    return Settings(
        _env_file=None,
        adapter_root=tmp_path / "adapters",
        adapter_store=store,
        adapter_cache_dir=tmp_path / "front-cache",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'store.db'}",
    )


def engine_settings(front: Settings, cache: Path) -> Settings:
    """An engine host's settings: the front's store, a cache of its own."""
    return front.model_copy(update={"adapter_cache_dir": cache})


@pytest.fixture
async def registered(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Settings]:
    """The front's settings, with ``legal`` (v1, v2) and ``other`` (v1) registered."""
    store = ""
    if request.param == "s3":
        request.getfixturevalue("aws")
        bucket = f"adapters-{uuid.uuid4().hex[:12]}"
        s3_client().create_bucket(Bucket=bucket)
        store = f"s3://{bucket}/engine-tests"
    settings = front_settings(tmp_path, store)
    base = BaseModelInfo.from_model_dir(EMBEDDED_MODEL_DIR)

    async def nothing() -> None:
        return None

    async with open_database(settings.database_url) as sessions:
        admin = AdminService.from_settings(settings, sessions, base, on_change=nothing)
        for name, seed in (("legal", 1), ("legal", 2), ("other", 3)):
            make_random_adapter(
                EMBEDDED_MODEL_DIR,
                settings.adapter_root / f"{name}-{seed}",
                rank=8,
                target_modules=("q_proj", "v_proj"),
                seed=seed,
            )
            register = partial(admin.storage.from_path, f"{name}-{seed}")
            await admin.register_adapter("admin:test", name, register)
        yield settings


def digest_of(settings: Settings, engine_name: str) -> str:
    location = S3Location.parse(settings.adapter_store)
    return S3Content(location).version_digest(engine_name)


def count_gets(resolver: StoreLoRAResolver) -> list[str]:
    """The keys of every GET the resolver's S3 client sends."""
    seen: list[str] = []
    lock = threading.Lock()

    def record(params: dict[str, Any], **_: Any) -> None:
        with lock:
            seen.append(params["Key"])

    client = resolver.versions._content.client  # type: ignore[attr-defined]
    client.meta.events.register("provide-client-params.s3.GetObject", record)
    return seen


@pytest.mark.parametrize("registered", ["s3", "local"], indirect=True)
async def test_a_global_name_resolves_to_this_hosts_checked_copy(
    registered: Settings, tmp_path: Path
) -> None:
    resolver = StoreLoRAResolver.from_settings(engine_settings(registered, tmp_path / "host-b"))
    first, second = [await resolver.resolve_lora(BASE, f"legal@v{n}") for n in (1, 2)]
    assert first is not None and second is not None
    assert (first.lora_name, second.lora_name) == ("legal@v1", "legal@v2")
    assert first.lora_path != second.lora_path
    for lora in (first, second):
        path = Path(lora.lora_path)
        assert (path / "adapter_config.json").is_file()
        assert (path / "adapter_model.safetensors").is_file()
        if registered.adapter_store:  # fetched into this host's cache, by digest
            assert path == tmp_path / "host-b" / "sha256" / digest_of(registered, lora.lora_name)


NOT_STORED_VERSIONS = (
    "legal@v3",
    "nobody@v1",
    "legal",
    "legal@v0",
    "legal@1",
    "../legal@v1",
    "a,b@v1",
)


@pytest.mark.parametrize("registered", ["s3", "local"], indirect=True)
async def test_what_is_not_a_stored_version_is_none(registered: Settings, tmp_path: Path) -> None:
    resolver = StoreLoRAResolver.from_settings(engine_settings(registered, tmp_path / "host-b"))
    for name in NOT_STORED_VERSIONS:
        assert await resolver.resolve_lora(BASE, name) is None, name


@pytest.mark.parametrize("registered", ["s3"], indirect=True)
async def test_eight_concurrent_first_resolutions_download_once(
    registered: Settings, tmp_path: Path
) -> None:
    # Without vLLM's per-name lock: the host cache alone makes it one download.
    resolver = StoreLoRAResolver.from_settings(engine_settings(registered, tmp_path / "host-b"))
    gets = count_gets(resolver)
    resolved = await asyncio.gather(*(resolver.resolve_lora(BASE, "legal@v1") for _ in range(8)))
    assert len({lora.lora_path for lora in resolved if lora is not None}) == 1
    digest = digest_of(registered, "legal@v1")
    content_gets = [key for key in gets if "/sha256/" in key]
    assert sorted(content_gets) == sorted(
        f"engine-tests/sha256/{digest}{suffix}"
        for suffix in (".json", "/adapter_config.json", "/adapter_model.safetensors")
    )


@pytest.mark.parametrize("registered", ["s3"], indirect=True)
async def test_a_digest_mismatch_is_a_503_and_nothing_is_kept(
    registered: Settings, tmp_path: Path
) -> None:
    location = S3Location.parse(registered.adapter_store)
    digest = digest_of(registered, "legal@v1")
    key = location.content_key(digest, "adapter_model.safetensors")
    weights = s3_client().get_object(Bucket=location.bucket, Key=key)["Body"].read()
    s3_client().put_object(Bucket=location.bucket, Key=key, Body=b"\1" + weights[1:])
    resolver = StoreLoRAResolver.from_settings(engine_settings(registered, tmp_path / "host-b"))

    with pytest.raises(GracefulHTTPError) as refused:
        await resolver.resolve_lora(BASE, "legal@v1")

    assert refused.value.http_status == HTTPStatus.SERVICE_UNAVAILABLE
    assert "legal@v1" in refused.value.message
    assert "adapter_content_corrupt" in refused.value.message
    assert location.bucket not in refused.value.message
    assert not (tmp_path / "host-b" / "sha256" / digest).exists()
    assert await resolver.resolve_lora(BASE, "other@v1") is not None  # others still resolve


@pytest.mark.parametrize("registered", ["s3"], indirect=True)
async def test_content_gone_from_the_bucket_is_a_404(registered: Settings, tmp_path: Path) -> None:
    location = S3Location.parse(registered.adapter_store)
    digest = digest_of(registered, "legal@v1")
    s3_client().delete_object(Bucket=location.bucket, Key=location.manifest_key(digest))
    resolver = StoreLoRAResolver.from_settings(engine_settings(registered, tmp_path / "host-b"))

    with pytest.raises(GracefulHTTPError) as refused:
        await resolver.resolve_lora(BASE, "legal@v1")

    assert refused.value.http_status == HTTPStatus.NOT_FOUND
    assert "adapter_content_missing" in refused.value.message


@pytest.mark.parametrize("registered", ["s3"], indirect=True)
async def test_an_unreachable_store_is_a_503(
    registered: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    resolver = StoreLoRAResolver.from_settings(engine_settings(registered, tmp_path / "host-b"))

    with pytest.raises(GracefulHTTPError) as refused:
        await resolver.resolve_lora(BASE, "legal@v1")

    assert refused.value.http_status == HTTPStatus.SERVICE_UNAVAILABLE
    assert "adapter_storage_unavailable" in refused.value.message


@pytest.mark.parametrize("registered", ["s3"], indirect=True)
async def test_a_resolved_version_is_never_evicted_from_under_the_engine(
    registered: Settings, tmp_path: Path
) -> None:
    # vLLM reloads an adapter from its path after its host-memory LRU dropped it: the cache
    # must not remove that directory while the engine lives, however small its bound.
    engine = engine_settings(registered, tmp_path / "host-b").model_copy(
        update={"adapter_cache_bytes": 1}
    )
    resolver = StoreLoRAResolver.from_settings(engine)
    served = await resolver.resolve_lora(BASE, "legal@v1")
    assert served is not None

    neighbour = AdapterCache(engine.adapter_cache_dir, max_bytes=1)  # another process's fetch
    location = S3Location.parse(registered.adapter_store)
    neighbour.fetch(digest_of(registered, "other@v1"), S3Content(location))

    assert (Path(served.lora_path) / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("registered", ["s3"], indirect=True)
async def test_a_stored_version_vllm_would_refuse_is_refused_naming_the_field(
    registered: Settings, tmp_path: Path
) -> None:
    # Stored before the upload check put configs to vLLM's reader: its first load would fail.
    source = make_random_adapter(
        EMBEDDED_MODEL_DIR, tmp_path / "old", rank=8, target_modules=("q_proj",), seed=9
    )
    content = S3Content(S3Location.parse(registered.adapter_store))
    publish_unchecked(content, "old", 1, with_config(source, lora_bias=True))
    resolver = StoreLoRAResolver.from_settings(engine_settings(registered, tmp_path / "host-b"))

    with pytest.raises(GracefulHTTPError) as refused:
        await resolver.resolve_lora(BASE, "old@v1")

    assert refused.value.http_status == HTTPStatus.UNPROCESSABLE_ENTITY
    assert "old@v1" in refused.value.message and "lora_bias" in refused.value.message
    assert "adapter_unservable" in refused.value.message
    assert await resolver.resolve_lora(BASE, "legal@v1") is not None  # others still resolve


def test_the_plugin_registers_the_resolver_once() -> None:
    lora_resolver.register()
    registered = LoRAResolverRegistry.get_resolver(RESOLVER_NAME)
    lora_resolver.register()
    assert LoRAResolverRegistry.get_resolver(RESOLVER_NAME) is registered
