"""Admin API wire models (``/admin/v1``)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from app.errors import BadRequestError
from app.protocol import INT64_MAX
from app.tenancy.manifests import ADAPTER_NAME_PATTERN as ADAPTER_NAME_PATTERN
from app.tenancy.manifests import (
    GRANT_ALIAS_PATTERN,
    GRANT_ALIAS_RULE,
    TENANT_ID_PATTERN,
    AdapterName,
    GrantSpec,
    ObjectiveMs,
    PriorityClass,
    RollbackSpec,
    ShadowSpec,
    VersionNumber,
    Weight,
)
from app.tenancy.tenants import DEFAULT_PRIORITY, DEFAULT_WEIGHT, Priority

Name = Annotated[str, Field(min_length=1, max_length=200)]
# Strict: an admin's 0, 1.0 or "5" is refused (400 naming the field), not read as
# false, 1 or 5; the API's schema says boolean and integer. At most int64: what the
# store's integer columns hold.
Positive = Annotated[int, Field(ge=1, le=INT64_MAX, strict=True)]
Flag = Annotated[bool, Field(strict=True)]
MAX_ADAPTER_PATH_LENGTH = 1024
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _rfc3339(value: Any) -> Any:
    # pydantic also reads a number (1700000000, "-8e-196") as a Unix time; the API's
    # schema says an RFC 3339 date-time, and a number is more likely a mistake than a time.
    if isinstance(value, (int, float)) or (
        isinstance(value, str) and _NUMBER.fullmatch(value.strip())
    ):
        raise PydanticCustomError(
            "datetime_format", "must be an RFC 3339 date-time, such as 2027-01-01T00:00:00Z"
        )
    return value


DateTime = Annotated[datetime, BeforeValidator(_rfc3339)]
# NAME_MAX of Linux filesystems: a longer directory name fails every filesystem call.
MAX_PATH_PART_BYTES = 255


def check_grant_alias(alias: str, base_model_id: str) -> str:
    """``alias`` if a grant may use it; else a 400 naming ``alias``.

    The base model's id is refused: the tenant's requests for it would be ambiguous.
    """
    if re.fullmatch(GRANT_ALIAS_PATTERN, alias) is None:
        shown = alias if len(alias) <= 40 else f"{alias[:40]}... ({len(alias)} characters)"
        raise BadRequestError(f"Invalid alias {shown!r}: {GRANT_ALIAS_RULE}.", param="alias")
    if alias == base_model_id:
        raise BadRequestError(
            f"The alias `{alias}` is the base model's id; choose another.", param="alias"
        )
    return alias


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantCreate(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"id": "acme-legal", "name": "ACME Legal LLP", "allow_base_model": False}]
        },
    )

    id: Annotated[str, Field(pattern=TENANT_ID_PATTERN)]
    name: Name
    allow_base_model: Flag = False
    weight: Weight = DEFAULT_WEIGHT
    priority: PriorityClass = DEFAULT_PRIORITY
    slo_ttft_ms: ObjectiveMs = 0
    slo_tpot_ms: ObjectiveMs = 0


class TenantUpdate(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"enabled": False}]})

    name: Name | None = None
    allow_base_model: Flag | None = None
    enabled: Flag | None = Field(None, description="false: every key of the tenant is refused")
    weight: Weight | None = None
    priority: PriorityClass | None = None
    slo_ttft_ms: ObjectiveMs | None = None
    slo_tpot_ms: ObjectiveMs | None = None


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class TenantOut(Out):
    id: str
    name: str
    allow_base_model: bool
    enabled: bool
    weight: int
    priority: Priority
    slo_ttft_ms: int
    slo_tpot_ms: int
    created_at: datetime


class KeyCreate(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"name": "production", "expires_at": "2027-01-01T00:00:00Z"}]
        },
    )

    name: Annotated[str, Field(max_length=200)] = ""
    expires_at: DateTime | None = None


class KeyOut(Out):
    id: str
    prefix: str
    name: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None


class KeyCreated(KeyOut):
    key: str = Field(description="The plaintext key: shown in this response only.")


class AdapterRegister(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"name": "legal_advisor", "path": "legal_advisor"}]},
    )

    name: AdapterName
    path: str = Field(
        min_length=1,
        max_length=MAX_ADAPTER_PATH_LENGTH,
        description="Directory relative to the adapter root.",
    )

    @field_validator("path")
    @classmethod
    def _usable(cls, path: str) -> str:
        # A NUL makes every filesystem call fail; other control characters have no place in
        # a directory name and would garble the audit log.
        if not path.isprintable():
            raise PydanticCustomError(
                "invalid_path", "the path must not contain control characters such as NUL"
            )
        if any(len(part.encode()) > MAX_PATH_PART_BYTES for part in path.split("/")):
            raise PydanticCustomError(
                "invalid_path",
                "each name in the path must be at most {limit} bytes",
                {"limit": MAX_PATH_PART_BYTES},
            )
        return path


class AdapterVersionOut(Out):
    name: str
    version: int
    rank: int
    target_modules: list[str]
    sha256: str
    size_bytes: int
    created_at: datetime
    unservable: str | None = Field(
        None, description="Why the engine could not load it; it is refused while this is set."
    )


class AdapterOut(BaseModel):
    name: str
    latest_version: int
    versions: list[AdapterVersionOut]


class GrantPut(GrantSpec):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"adapter": "legal_advisor", "version": 2},
                {"adapter": "support", "versions": {"3": 90, "4": 10}, "sticky": "user"},
            ]
        },
    )


class RolledBack(BaseModel):
    """The last rollback of a grant: what it replaced, by whom, when."""

    to: int
    at: datetime
    actor: str
    reason: str
    replaced: str = Field(description="What the alias was served with before, as `describe`d.")


class GrantOut(BaseModel):
    tenant_id: str
    alias: str
    adapter: str
    version: int | None = Field(description="The pinned version; null: a split or the latest.")
    versions: dict[int, int] | None = Field(description="A split: version -> weight.")
    sticky: Literal["request", "user"]
    shadow: ShadowSpec | None = Field(description="The shadowed candidate, if any.")
    rollback: RollbackSpec | None = Field(description="The automatic rollback rule, if any.")
    resolved_version: int | None = Field(
        description="The version a pin or follow-latest grant serves now; null for a split."
    )
    rolled_back: RolledBack | None = Field(
        description="Set by a rollback; cleared when the grant is put again."
    )


class Quantiles(BaseModel):
    p50: float
    p95: float
    mean: float


class VersionStatsOut(BaseModel):
    version: int
    requests: int
    errors: int = Field(
        description="Failed by the version's doing (the engine, the adapter's load, upstream "
        "5xx); refusals and failures that are the request's own excluded."
    )
    error_rate: float
    finish_reasons: dict[str, int] = Field(description="The first choice's, counted.")
    ttft_ms: Quantiles | None = Field(description="Time to first token (streamed in the front).")
    itl_ms: Quantiles | None = Field(description="Each request's mean inter-token latency.")
    completion_tokens: Quantiles | None


class VersionComparison(BaseModel):
    tenant_id: str
    alias: str
    since: datetime
    versions: list[VersionStatsOut] = Field(description="Each version that served the alias.")


class GrantRollback(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"version": 3}]})

    version: VersionNumber = Field(description="The version that takes all of the alias's traffic.")


class QuotaPut(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "requests_per_minute": 600,
                    "tokens_per_minute": 200000,
                    "max_concurrent_requests": 16,
                    "token_budget": 50000000,
                    "budget_period": "month",
                }
            ]
        },
    )

    requests_per_minute: Positive | None = None
    tokens_per_minute: Positive | None = None
    max_concurrent_requests: Positive | None = None
    token_budget: Positive | None = None
    budget_period: Literal["day", "month"] | None = None


class TenantQuotaPut(QuotaPut):
    """A tenant's limits: a key's, and what only a tenant has."""

    storage_bytes: Positive | None = Field(
        None,
        description="What the tenant's files and stored responses may hold together, in "
        "bytes (unset: the default_storage_bytes setting).",
    )
    batch_tokens_enqueued: Positive | None = Field(
        None,
        description="The worst-case tokens the tenant's batches' unrun lines may add up to: a "
        "batch is refused (429) once they do, and fails validation if it would pass it.",
    )


class QuotaOut(TenantQuotaPut):
    model_config = ConfigDict(extra="ignore", from_attributes=True)

    tenant_id: str


class QuotaUsageOut(BaseModel):
    """What a tenant holds of its limits now (``None``: that limit is unset)."""

    tenant_id: str
    requests_per_minute_used: float | None = Field(
        description="The requests-per-minute level: requests charged and not yet drained."
    )
    tokens_per_minute_used: float | None = Field(
        description="The tokens-per-minute level (reserved worst cases, settled to actual)."
    )
    concurrent_requests: int = Field(description="Live concurrency leases.")
    budget_used: int | None = Field(description="Tokens charged in the current budget period.")
    budget_period: str | None = Field(description="The current period: 2025-01-31 or 2025-01.")


class KeyQuotaOut(QuotaPut):
    """A key's own limits, enforced together with its tenant's."""

    model_config = ConfigDict(extra="ignore", from_attributes=True)

    key_id: str


class AuditOut(Out):
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    outcome: str
    detail: str


class AuditPage(BaseModel):
    data: list[AuditOut]
    next_offset: int | None = Field(description="Pass as `offset` for the next (older) page.")


class UsageTotalOut(Out):
    group: str | None = Field(description="adapter alias, key id or UTC day; null: no grouping")
    requests: int
    prompt_tokens: int
    completion_tokens: int


class UsageReport(BaseModel):
    tenant_id: str
    group_by: Literal["adapter", "key", "day"] | None
    data: list[UsageTotalOut]


class AdapterResidencyOut(BaseModel):
    name: str
    version: int
    tier: Literal["device", "host", "storage"] = Field(
        description="device: in a slot; host: in host memory; storage: on disk only"
    )
    last_used_at: datetime | None
    uses: dict[str, int] = Field(description="requests served per tier: device, host, storage")
    hits: int = Field(description="requests served from a device slot")
    misses: int = Field(description="requests that had to load the adapter from storage")
    mean_swap_ms: dict[str, float] = Field(description="per stage: load, activate")
