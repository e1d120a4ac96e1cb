"""Declarative tenant manifests (``tenants/*.yaml``) and the hashed key file.

A manifest::

    id: acme-legal
    name: ACME Legal LLP
    allow_base_model: false
    adapters:            # alias the tenant calls -> registered adapter
      legal_advisor: legal_advisor
    api_keys:            # optional; hashes only, never plaintext
      - {id: key_1a2b, sha256: "<hex>", prefix: "sk-lgw-AbCdEf"}

Keys issued by ``lora-gateway keys create`` live in a separate YAML file
(a list of the same key records plus ``tenant_id``), so committed manifests
never change when a key is issued.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.tenancy.models import ApiKey, Tenant

TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class ManifestError(ValueError):
    """A manifest or key file that cannot be applied."""


class KeyRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    prefix: str = ""
    name: str = ""


class TenantManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=TENANT_ID_PATTERN)
    name: str
    allow_base_model: bool = False
    enabled: bool = True
    adapters: dict[str, str] = Field(default_factory=dict)
    api_keys: list[KeyRecord] = Field(default_factory=list)

    def tenant(self) -> Tenant:
        return Tenant(
            id=self.id,
            name=self.name,
            allow_base_model=self.allow_base_model,
            adapters=dict(self.adapters),
            enabled=self.enabled,
        )


class IssuedKey(KeyRecord):
    tenant_id: str


def _read_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ManifestError(f"{path}: {exc}") from exc


def load_manifests(directory: Path) -> list[TenantManifest]:
    manifests = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            manifests.append(TenantManifest.model_validate(_read_yaml(path)))
        except ValidationError as exc:
            raise ManifestError(f"{path}: {exc}") from exc
    ids = [m.id for m in manifests]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ManifestError(f"{directory}: tenant ids defined twice: {duplicates}")
    return manifests


def load_issued_keys(path: Path) -> list[IssuedKey]:
    if not path.is_file():
        return []
    items = _read_yaml(path) or []
    if not isinstance(items, list):
        raise ManifestError(f"{path}: expected a list of keys")
    try:
        return [IssuedKey.model_validate(item) for item in items]
    except ValidationError as exc:
        raise ManifestError(f"{path}: {exc}") from exc


def save_issued_keys(path: Path, keys: list[IssuedKey]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    staging.write_text(yaml.safe_dump([k.model_dump() for k in keys], sort_keys=False))
    staging.chmod(0o600)
    staging.replace(path)


def load_tenants(directory: Path, keys_file: Path) -> tuple[list[Tenant], list[ApiKey]]:
    """Tenants from the manifests, with keys from both manifests and the key file."""
    manifests = load_manifests(directory)
    keys = [
        ApiKey(id=k.id, tenant_id=m.id, sha256=k.sha256, prefix=k.prefix, name=k.name)
        for m in manifests
        for k in m.api_keys
    ]
    known = {m.id for m in manifests}
    for k in load_issued_keys(keys_file):
        if k.tenant_id not in known:
            raise ManifestError(f"{keys_file}: key {k.id} names unknown tenant {k.tenant_id!r}")
        keys.append(
            ApiKey(id=k.id, tenant_id=k.tenant_id, sha256=k.sha256, prefix=k.prefix, name=k.name)
        )
    return [m.tenant() for m in manifests], keys
