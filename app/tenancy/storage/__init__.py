"""Where accepted adapter versions live: the interface (:mod:`.base`), one module per storage
(:mod:`.local`, :mod:`.s3`), the host cache object storage reads through (:mod:`.cache`), and
:func:`open_adapter_store` above them, which picks the storage from the settings.
"""

from __future__ import annotations

from app.settings import Settings
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.storage.base import STORE_DIR, AdapterStore
from app.tenancy.storage.cache import AdapterCache
from app.tenancy.storage.local import LocalAdapterStore
from app.tenancy.storage.s3 import S3AdapterStore, S3Content, S3Location

__all__ = [
    "STORE_DIR",
    "AdapterStore",
    "LocalAdapterStore",
    "S3AdapterStore",
    "open_adapter_store",
]


def open_adapter_store(settings: Settings, base_model: BaseModelInfo) -> AdapterStore:
    """The adapter store the settings name, checking adapters against ``base_model``."""
    limits = {"max_rank": settings.max_lora_rank, "max_bytes": settings.max_adapter_bytes}
    if not settings.adapter_store:
        return LocalAdapterStore(settings.adapter_root, base_model, **limits)
    return S3AdapterStore(
        settings.adapter_root,
        base_model,
        **limits,
        content=S3Content(S3Location.parse(settings.adapter_store)),
        cache=AdapterCache(settings.adapter_cache_dir, settings.adapter_cache_bytes),
    )
