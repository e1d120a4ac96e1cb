"""Declarative tenant manifests (``tenants/*.yaml``), applied to the store by
``lora-gateway tenants apply``.

A manifest::

    id: acme-legal
    name: ACME Legal LLP
    allow_base_model: false
    weight: 2            # share of the engine under contention (default 1)
    priority: batch      # interactive (default) or batch
    slo_ttft_ms: 2000    # its own latency objectives (default 0: its class's settings)
    slo_tpot_ms: 200
    adapters:            # alias the tenant calls -> registered adapter (latest version)
      legal_advisor: legal_advisor
      support:           # or a split of versions (docs/rollouts.md)
        adapter: support
        versions: {3: 90, 4: 10}
        sticky: user     # one version per end user (`user`), not per request

Keys are never declared: they are issued (and shown once) by the API or CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from app.tenancy.grants import MAX_SPLIT_VERSIONS, MAX_SPLIT_WEIGHT
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
# A latency objective of the tenant's own, in ms; 0: its class's (the settings'). At most a
# day: beyond, it is no objective.
MAX_OBJECTIVE_MS: Final = 86_400_000
ObjectiveMs = Annotated[
    int,
    Field(
        ge=0,
        le=MAX_OBJECTIVE_MS,
        strict=True,
        description="The tenant's own latency objective in ms (0: its priority class's).",
    ),
]


# At most int32: the store's version column.
VersionNumber = Annotated[int, Field(ge=1, le=2**31 - 1, strict=True)]
# As a key of a JSON object, a version is a string of digits.
VersionKey = Annotated[int, Field(ge=1, le=2**31 - 1)]
SplitWeight = Annotated[int, Field(ge=0, le=MAX_SPLIT_WEIGHT, strict=True)]


class RollbackSpec(BaseModel):
    """Roll a split back to one version automatically, on another version's error rate."""

    model_config = ConfigDict(extra="forbid")

    to: VersionNumber = Field(description="The split's version that takes all traffic.")
    error_rate: float = Field(
        gt=0, le=1, description="A version failing more than this share of its requests..."
    )
    window_seconds: int = Field(
        300, ge=10, le=86_400, strict=True, description="...over this many seconds..."
    )
    min_requests: int = Field(
        50, ge=1, le=1_000_000, strict=True, description="...and at least this many requests."
    )


class ShadowSpec(BaseModel):
    """Also send a share of the alias's requests to a candidate version, whose answers are
    discarded (docs/rollouts.md)."""

    model_config = ConfigDict(extra="forbid")

    version: VersionNumber = Field(description="The candidate; not a version of the split.")
    percent: int = Field(ge=1, le=100, strict=True, description="Share of requests shadowed.")


class GrantSpec(BaseModel):
    """What an alias is served with: the latest version of ``adapter``, one pinned
    ``version``, or a weighted split of ``versions``."""

    model_config = ConfigDict(extra="forbid")

    adapter: AdapterName
    version: VersionNumber | None = Field(
        None, description="Pin one version; omit this and `versions` to follow the latest."
    )
    versions: dict[VersionKey, SplitWeight] | None = Field(
        None,
        description=(
            f"A split: 2 to {MAX_SPLIT_VERSIONS} versions of the adapter -> integer weights "
            f"0 to {MAX_SPLIT_WEIGHT}, at least one above 0, e.g. {{3: 90, 4: 10}}."
        ),
    )
    sticky: Literal["request", "user"] = Field(
        "request",
        description=(
            "request: each request draws a version by weight; user: every request with the "
            "same `user` (else the same API key) gets the same version while the weights stay."
        ),
    )
    shadow: ShadowSpec | None = Field(
        None, description="Also run a share of the requests on a candidate version, unseen."
    )
    rollback: RollbackSpec | None = Field(
        None, description="Roll the split back on its own (the versions' errors: 5xx, engine)."
    )

    @field_validator("versions")
    @classmethod
    def _split(cls, versions: dict[int, int] | None, info: ValidationInfo) -> dict[int, int] | None:
        if versions is None:
            return None
        if info.data.get("version") is not None:
            raise PydanticCustomError("split", "pin one `version` or split `versions`, not both")
        if not 2 <= len(versions) <= MAX_SPLIT_VERSIONS:
            raise PydanticCustomError(
                "split",
                "a split has 2 to {most} versions (pin one with `version`)",
                {"most": MAX_SPLIT_VERSIONS},
            )
        if not any(versions.values()):
            raise PydanticCustomError("split", "at least one version needs a weight above 0")
        return dict(sorted(versions.items()))

    @field_validator("shadow")
    @classmethod
    def _shadow_apart(cls, shadow: ShadowSpec | None, info: ValidationInfo) -> ShadowSpec | None:
        if shadow is not None and (
            shadow.version == info.data.get("version")
            or shadow.version in (info.data.get("versions") or {})
        ):
            raise PydanticCustomError(
                "shadow",
                "the shadow version ({version}) also serves the alias; shadow another",
                {"version": shadow.version},
            )
        return shadow

    @field_validator("rollback")
    @classmethod
    def _rollback_of_a_split(
        cls, rollback: RollbackSpec | None, info: ValidationInfo
    ) -> RollbackSpec | None:
        if rollback is None:
            return None
        versions = info.data.get("versions")
        if not versions:
            raise PydanticCustomError("rollback", "a rollback rule needs a split (`versions`)")
        if rollback.to not in versions:
            raise PydanticCustomError(
                "rollback",
                "`rollback.to` ({to}) is not a version of the split",
                {"to": rollback.to},
            )
        return rollback

    def describe(self) -> str:
        """How ``tenants apply`` and the audit log say what the alias is served with."""
        if self.versions is not None:
            split = ", ".join(f"v{v}: {w}" for v, w in self.versions.items())
            sticky = " sticky per user" if self.sticky == "user" else ""
            rule = self.rollback
            back = f", back to v{rule.to} above {rule.error_rate:.0%} errors" if rule else ""
            served = f"{self.adapter} {{{split}}}{sticky}{back}"
        else:
            served = f"{self.adapter} v{self.version}" if self.version else self.adapter
        shadow = self.shadow
        return served + (f", shadowed {shadow.percent}% on v{shadow.version}" if shadow else "")


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
    slo_ttft_ms: ObjectiveMs = 0
    slo_tpot_ms: ObjectiveMs = 0
    adapters: dict[GrantAlias, AdapterName | GrantSpec] = Field(default_factory=dict)

    def grants(self) -> dict[str, GrantSpec]:
        """Each alias's grant; the short form ``alias: adapter`` follows the latest version."""
        return {
            alias: GrantSpec(adapter=spec) if isinstance(spec, str) else spec
            for alias, spec in self.adapters.items()
        }


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
