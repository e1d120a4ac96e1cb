"""vLLM LoRA resolver: an engine serves an adapter version by its global name, ``name@vN``.

When vLLM's server meets a model name it has not loaded, it asks its registered resolvers;
:class:`StoreLoRAResolver` answers from the shared adapter store without the gateway: the
version's digest (the bucket's version index, or the local store's database), this host's
checked copy of that content (:mod:`app.tenancy.storage.cache`), and a ``LoRARequest`` for
it. An unknown name is ``None`` (vLLM's 404); missing, corrupt or unreachable content is a
``GracefulHTTPError`` with our status, and nothing is loaded. So is a config vLLM's own
reader refuses under this engine's ``max_lora_rank`` (a version stored before the upload
check asked that reader): 422 ``adapter_unservable``, naming the field. Whatever still fails
to load inside the engine fails that request alone (:mod:`app.inside_vllm.load_failures`).
Every copy served stays held while the process lives: vLLM reloads from the path whenever
its host LRU dropped the adapter. The long story: docs/scale-out.md, "The resolver".
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable
from contextlib import ExitStack
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from vllm.exceptions import GracefulHTTPError
from vllm.lora.request import LoRARequest
from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

from app.errors import GatewayError
from app.settings import Settings
from app.tenancy.adapters import AdapterError
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.storage import open_adapter_store
from app.tenancy.storage.cache import AdapterCache
from app.tenancy.storage.errors import AdapterContentMissing
from app.tenancy.storage.s3 import S3Content, S3Location
from app.tenancy.validation import check_engine_rules

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

logger = logging.getLogger("lora_gateway.lora_resolver")

RESOLVER_NAME = "lora_gateway_store"
# The admin API's adapter names (ADAPTER_NAME_PATTERN), then the version: no slash, no comma
# (the EPP splits vllm:lora_requests_info's adapter lists on commas).
GLOBAL_NAME = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,99})@v(?P<version>[1-9][0-9]{0,8})")


class VersionIndex(Protocol):
    """Which content a version is."""

    async def digest(self, name: str, version: int) -> str | None:
        """The content digest of ``name@v<version>``; ``None`` when no such version exists."""


class BucketVersions:
    """``versions/<name>@v<N>.json`` in the bucket the admin service publishes to."""

    def __init__(self, content: S3Content) -> None:
        self._content = content

    async def digest(self, name: str, version: int) -> str | None:
        try:
            return await asyncio.to_thread(self._content.version_digest, f"{name}@v{version}")
        except AdapterContentMissing:
            return None


class DatabaseVersions:
    """The store's ``adapter_versions`` table (local-directory store: one host, one database)."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._engine: AsyncEngine | None = None

    async def digest(self, name: str, version: int) -> str | None:
        from sqlalchemy import select

        from app.store.db import create_engine
        from app.store.tables import AdapterVersionRow

        if self._engine is None:  # in vLLM's event loop, where it is used
            self._engine = create_engine(self._url)
        query = select(AdapterVersionRow.sha256).where(
            AdapterVersionRow.name == name, AdapterVersionRow.version == version
        )
        async with self._engine.connect() as connection:
            digest = await connection.scalar(query)
        return str(digest) if digest is not None else None


class CachedBucketContent:
    """Content in the bucket, through this host's cache; every entry served stays held."""

    def __init__(self, cache: AdapterCache, content: S3Content) -> None:
        self._cache = cache
        self._content = content
        self._held: dict[str, Path] = {}
        self._holds: list[ExitStack] = []
        self._lock = threading.Lock()

    def __call__(self, digest: str) -> Path:
        with self._lock:
            if digest in self._held:
                return self._held[digest]
        # Outside the lock: one adapter's download must not hold up another's.
        hold = ExitStack()
        path = hold.enter_context(self._cache.open(digest, self._content))
        with self._lock:
            if digest in self._held:  # two names of the same content, resolved at once
                hold.close()
            else:
                self._held[digest] = path
                self._holds.append(hold)
            return self._held[digest]


class StoreLoRAResolver(LoRAResolver):
    """Global adapter version names -> ``LoRARequest`` for this host's copy of the content."""

    def __init__(
        self, versions: VersionIndex, local_copy: Callable[[str], Path], *, max_rank: int
    ) -> None:
        """``local_copy``: this host's directory of a digest's content, fetched first if
        needed and kept in place while this process lives (it may block); ``max_rank``: the
        engine's ``max_lora_rank``."""
        self.versions = versions
        self.local_copy = local_copy
        self.max_rank = max_rank

    @classmethod
    def from_settings(cls, settings: Settings) -> StoreLoRAResolver:
        if settings.adapter_store:
            bucket = S3Content(S3Location.parse(settings.adapter_store))
            cache = AdapterCache(settings.adapter_cache_dir, settings.adapter_cache_bytes)
            content = CachedBucketContent(cache, bucket)
            return cls(BucketVersions(bucket), content, max_rank=settings.max_lora_rank)
        # One host: the store's own directory, which nothing evicts.
        store = open_adapter_store(settings, BaseModelInfo.for_settings(settings))
        versions = DatabaseVersions(settings.database_url)
        return cls(versions, store.local_copy, max_rank=settings.max_lora_rank)

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        match = GLOBAL_NAME.fullmatch(lora_name)
        if match is None:
            return None
        try:
            digest = await self.versions.digest(match["name"], int(match["version"]))
            if digest is None:
                return None
            path = await asyncio.to_thread(self.local_copy, digest)
        except GatewayError as exc:
            logger.warning("adapter %s refused: %s", lora_name, exc.message)
            raise GracefulHTTPError(
                f"Adapter `{lora_name}` cannot be loaded: {exc.message} ({exc.code})",
                HTTPStatus(exc.status_code),
            ) from exc
        try:
            await asyncio.to_thread(check_engine_rules, path, self.max_rank)
        except AdapterError as exc:
            logger.warning("adapter %s refused: %s", lora_name, exc)
            raise GracefulHTTPError(
                f"Adapter `{lora_name}` cannot be served: {exc} (adapter_unservable)",
                HTTPStatus.UNPROCESSABLE_ENTITY,
            ) from exc
        logger.info("resolved %s to content %s", lora_name, digest[:12])
        # vLLM numbers resolved adapters itself (it overwrites lora_int_id); the name and the
        # content-addressed path identify the version for its prefix cache.
        return LoRARequest(lora_name=lora_name, lora_int_id=1, lora_path=str(path))


def register() -> None:
    """``vllm.general_plugins`` entry point ``lora_gateway_resolver``: register the resolver
    (vLLM calls this in each of its processes; only the API server's asks resolvers).

    Settings come from the environment the engine role gives vLLM's server, read on the
    first resolution so that processes which never resolve never build a client."""
    if RESOLVER_NAME not in LoRAResolverRegistry.get_supported_resolvers():
        # vLLM configures logging for its own loggers only: ours would drop INFO and below.
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
        LoRAResolverRegistry.register_resolver(RESOLVER_NAME, StoreResolver())


class StoreResolver(LoRAResolver):
    """The registered resolver: a :class:`StoreLoRAResolver` built from the environment's
    settings on first use."""

    def __init__(self) -> None:
        self._resolver: StoreLoRAResolver | None = None

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        if self._resolver is None:
            self._resolver = StoreLoRAResolver.from_settings(Settings())
        return await self._resolver.resolve_lora(base_model_name, lora_name)
