"""What goes wrong when stored adapter content is read back, as gateway errors.

GatewayError
├── NotFoundError                 404
│   └── AdapterContentMissing         adapter_content_missing: no complete manifest, or a
│                                     file it names is gone
└── EngineUnavailableError        503
    ├── AdapterContentCorrupt         adapter_content_corrupt: a size or sha256 differs
    └── AdapterStorageUnavailable     adapter_storage_unavailable: the object store cannot
                                      be reached or refused us

Messages name the content digest and the file, never a bucket, a host path or an adapter
name, so they can be shown to whoever asked for the adapter.
"""

from __future__ import annotations

from app.errors import EngineUnavailableError, NotFoundError


class AdapterContentMissing(NotFoundError):
    code = "adapter_content_missing"


class AdapterContentCorrupt(EngineUnavailableError):
    code = "adapter_content_corrupt"


class AdapterStorageUnavailable(EngineUnavailableError):
    code = "adapter_storage_unavailable"
