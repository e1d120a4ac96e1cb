"""Declarative tenant manifests (``tenants/*.yaml``), applied to the store by
``lora-gateway tenants apply``.

A manifest::

    id: acme-legal
    name: ACME Legal LLP
    allow_base_model: false
    weight: 2            # share of the engine under contention (default 1)
    priority: batch      # interactive (default) or batch
    adapters:            # alias the tenant calls -> registered adapter (latest version)
      legal_advisor: legal_advisor

Keys are never declared: they are issued (and shown once) by the API or CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.tenancy.tenants import DEFAULT_PRIORITY, DEFAULT_WEIGHT, Priority

TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
# A grant alias is what tenants send as `model`, and it appears in URLs, metric labels and
# the usage ledger: letters, digits and `. _ - : @` (OpenAI's fine-tune ids use colons),
# starting with a letter or digit; no slashes (one URL path segment), whitespace, control
# characters or commas. 100 characters at most: the store's column width.
MAX_ALIAS_LENGTH = 100
GRANT_ALIAS_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:@-]{{0,{MAX_ALIAS_LENGTH - 1}}}$"
GRANT_ALIAS_RULE = (
    f"an alias is 1 to {MAX_ALIAS_LENGTH} letters, digits and . _ - : @, "
    "starting with a letter or digit"
)
GrantAlias = Annotated[str, Field(pattern=GRANT_ALIAS_PATTERN, description=GRANT_ALIAS_RULE)]
AdapterName = Annotated[str, Field(pattern=ADAPTER_NAME_PATTERN)]
# A weight is a share relative to other tenants'; beyond a few hundred a tenant would take
# the engine whole, and the scheduler's token credit (weight x quantum) stays an int.
MAX_WEIGHT: Final = 1000
Weight = Annotated[
    int,
    Field(
        ge=1,
        le=MAX_WEIGHT,
        strict=True,
        description="Share of the engine under contention, relative to other tenants' weights.",
    ),
]
PriorityClass = Annotated[
    Priority,
    Field(description="interactive: latency-sensitive; batch: may wait (the llm-d objective)."),
]


class ManifestError(ValueError):
    """A manifest that cannot be applied."""


class TenantManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=TENANT_ID_PATTERN)
    name: str
    allow_base_model: bool = False
    enabled: bool = True
    weight: Weight = DEFAULT_WEIGHT
    priority: PriorityClass = DEFAULT_PRIORITY
    adapters: dict[GrantAlias, AdapterName] = Field(default_factory=dict)


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
