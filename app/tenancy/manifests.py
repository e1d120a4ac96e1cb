"""Declarative tenant manifests (``tenants/*.yaml``), applied to the store by
``lora-gateway tenants apply``.

A manifest::

    id: acme-legal
    name: ACME Legal LLP
    allow_base_model: false
    adapters:            # alias the tenant calls -> registered adapter (latest version)
      legal_advisor: legal_advisor

Keys are never declared: they are issued (and shown once) by the API or CLI.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class ManifestError(ValueError):
    """A manifest that cannot be applied."""


class TenantManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=TENANT_ID_PATTERN)
    name: str
    allow_base_model: bool = False
    enabled: bool = True
    adapters: dict[str, str] = Field(default_factory=dict)


def load_manifests(directory: Path) -> list[TenantManifest]:
    manifests = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            manifests.append(TenantManifest.model_validate(yaml.safe_load(path.read_text())))
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise ManifestError(f"{path}: {exc}") from exc
    ids = [m.id for m in manifests]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ManifestError(f"{directory}: tenant ids defined twice: {duplicates}")
    return manifests
