"""API keys, the tenant registry (authentication, model resolution) and adapter versions."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from app.errors import AuthenticationError, ModelNotFoundError, PermissionDeniedError
from app.tenancy import keys
from app.tenancy.adapters import Adapter
from app.tenancy.grants import Grant, Weighted
from app.tenancy.registry import TenantRegistry
from app.tenancy.tenants import ApiKey, Tenant

LEGAL = Adapter("legal", 1, "a" * 64, Path("/x/legal"), 8, ("q_proj",), lora_id=1)
MEDICAL = Adapter("medical", 3, "b" * 64, Path("/x/medical"), 8, ("q_proj",), lora_id=7)
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def make_registry(
    *, enabled: bool = True, expires_at: datetime | None = None
) -> tuple[TenantRegistry, str]:
    key = keys.generate_key()
    tenants = [
        Tenant("acme", "ACME", grants={"my-legal": Grant.of(LEGAL)}, enabled=enabled),
        Tenant("clinic", "Clinic", allow_base_model=True, grants={"scribe": Grant.of(MEDICAL)}),
    ]
    records = [ApiKey(id="k1", tenant_id="acme", sha256=keys.hash_key(key), expires_at=expires_at)]
    return TenantRegistry(tenants, records, base_model_id="base"), key


def test_keys_are_random_and_only_their_hash_is_kept() -> None:
    first, second = keys.generate_key(), keys.generate_key()
    assert first != second and first.startswith(keys.KEY_PREFIX)
    assert len(keys.hash_key(first)) == 64 and keys.hash_key(first) != first
    assert keys.display_prefix(first) == first[: keys.DISPLAY_PREFIX_LEN]


def test_authenticate() -> None:
    registry, key = make_registry()
    principal = registry.authenticate(key)
    assert principal.tenant.id == "acme" and principal.key_id == "k1"
    for bad in (None, "", key + "x", keys.generate_key()):
        with pytest.raises(AuthenticationError):
            registry.authenticate(bad)


def test_expired_keys_and_disabled_tenants_are_refused() -> None:
    registry, key = make_registry(expires_at=NOW)
    assert registry.authenticate(key, now=NOW - timedelta(seconds=1)).key_id == "k1"
    with pytest.raises(AuthenticationError, match="expired"):
        registry.authenticate(key, now=NOW)
    registry, key = make_registry(enabled=False)
    with pytest.raises(PermissionDeniedError):
        registry.authenticate(key)


def test_resolve_only_granted_aliases() -> None:
    registry, _ = make_registry()
    acme, clinic = registry.tenant("acme"), registry.tenant("clinic")
    assert acme is not None and clinic is not None
    assert registry.resolve(acme, "my-legal").adapter == LEGAL
    assert registry.resolve(clinic, "base").adapter is None
    # The adapter's own name, another tenant's alias, and the base model
    # without permission all look the same as a name that does not exist.
    for tenant, model in ((acme, "legal"), (acme, "scribe"), (acme, "base"), (clinic, "nope")):
        with pytest.raises(ModelNotFoundError) as caught:
            registry.resolve(tenant, model)
        assert caught.value.body()["error"]["code"] == "model_not_found"
    assert [e.id for e in registry.models_for(acme)] == ["my-legal"]
    assert [(e.id, e.parent) for e in registry.models_for(clinic)] == [
        ("base", None),
        ("scribe", "base"),
    ]
    assert registry.adapters() == {LEGAL, MEDICAL}


def test_versions_have_distinct_engine_identities() -> None:
    assert LEGAL.engine_name == "legal@v1"
    newer = Adapter("legal", 2, "c" * 64, Path("/x/legal2"), 8, ("q_proj",), lora_id=9)
    assert newer.engine_name != LEGAL.engine_name and newer.lora_id != LEGAL.lora_id


def test_a_split_alias_resolves_to_the_version_picked_for_the_end_user() -> None:
    v1, v2 = (
        Adapter("legal", n, f"{n:064x}", Path("/x"), 8, ("q_proj",), lora_id=n) for n in (1, 2)
    )
    grant = Grant((Weighted(v1, 50), Weighted(v2, 50)), sticky=True)
    tenant = Tenant("acme", "ACME", grants={"legal": grant})
    registry = TenantRegistry([tenant], [], base_model_id="base")
    picked = {registry.resolve(tenant, "legal", sticky_key=f"user:{n}").adapter for n in range(64)}
    assert picked == {v1, v2}
    again = registry.resolve(tenant, "legal", sticky_key="user:7")
    assert again == registry.resolve(tenant, "legal", sticky_key="user:7")
    assert again.model == "legal"
    assert registry.adapters() == {v1, v2}
