"""Immutable values that describe who calls and what a call is served with."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from app.quota.limits import Limits
from app.tenancy.adapters import Adapter
from app.tenancy.grants import Grant

Priority = Literal["interactive", "batch"]
"""A tenant's scheduling class: ``interactive`` traffic is latency-sensitive, ``batch`` may
wait. The front tier sends it as the llm-d objective header."""

PRIORITIES: Final[tuple[Priority, ...]] = ("interactive", "batch")
DEFAULT_WEIGHT: Final = 1
DEFAULT_PRIORITY: Final[Priority] = "interactive"


def new_tenant_uid() -> str:
    """A tenant's internal id: never reused, whatever becomes of its public id."""
    return uuid.uuid4().hex


def new_cache_salt() -> str:
    """A tenant's prefix-cache salt: random, so no other tenant (nor a later tenant of the
    same id) can compute it and reach its cached prefixes."""
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Tenant:
    """One tenant, as created: ``id`` is its public name, ``uid`` this incarnation of it. A
    tenant deleted and created again under the same ``id`` is another tenant, with another
    ``uid`` (its usage and quota state are its own) and another ``cache_salt``."""

    id: str
    name: str
    allow_base_model: bool = False
    # alias the tenant passes as `model` -> the adapter version(s) it is served with
    grants: Mapping[str, Grant] = field(default_factory=dict)
    enabled: bool = True
    limits: Limits = field(default_factory=Limits)
    # The tenant's share of the engine relative to other tenants' (>= 1): under contention a
    # tenant of weight 2 is admitted twice the tokens of a tenant of weight 1.
    weight: int = DEFAULT_WEIGHT
    priority: Priority = DEFAULT_PRIORITY
    # Its own latency objectives in ms, time to first token and per output token after it
    # (0: its priority class's, from the settings).
    slo_ttft_ms: int = 0
    slo_tpot_ms: int = 0
    uid: str = field(default_factory=new_tenant_uid)
    # Requests share prefix-cache entries only when their salts match: the tenant's own.
    cache_salt: str = field(default_factory=new_cache_salt, repr=False)

    @property
    def quota_subject(self) -> str:
        """What the quota backend charges the tenant's own limits to: this incarnation's, so
        a tenant created again under a used id starts with none of the old one's usage."""
        return f"{self.id}@{self.uid}"


@dataclass(frozen=True)
class ApiKey:
    """A stored key: never the plaintext, only its hash and display prefix."""

    id: str
    tenant_id: str
    sha256: str
    prefix: str = ""
    name: str = ""
    expires_at: datetime | None = None
    # enforced on top of the tenant's limits
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of one request."""

    tenant: Tenant
    key: ApiKey

    @property
    def key_id(self) -> str:
        return self.key.id


@dataclass(frozen=True)
class ModelTarget:
    """What one request's `model` resolved to: an adapter, or the base model."""

    model: str
    adapter: Adapter | None
    # Whether the alias is split across versions (its metrics then name the version).
    split: bool = False
    # A candidate version this request is also run on, its answer discarded (a shadow).
    shadow: Adapter | None = None
