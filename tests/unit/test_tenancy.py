from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import AuthenticationError, ModelNotFoundError, PermissionDeniedError
from app.tenancy import keys
from app.tenancy.adapters import AdapterCatalog, AdapterError, read_lora_config
from app.tenancy.manifests import ManifestError, load_tenants
from app.tenancy.models import ApiKey, Tenant
from app.tenancy.registry import TenantRegistry


def write_adapter(root: Path, name: str, rank: int = 8, weights: bytes = b"w") -> Path:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "target_modules": ["q_proj", "v_proj"]}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    (directory / "adapter_model.safetensors").write_bytes(weights)
    return directory


@pytest.fixture
def catalog(tmp_path: Path) -> AdapterCatalog:
    write_adapter(tmp_path, "legal")
    write_adapter(tmp_path, "medical")
    catalog = AdapterCatalog(tmp_path, max_rank=32)
    catalog.scan()
    return catalog


def make_registry(catalog: AdapterCatalog, *, enabled: bool = True) -> tuple[TenantRegistry, str]:
    key = keys.generate_key()
    tenants = [
        Tenant("acme", "ACME", adapters={"my-legal": "legal"}, enabled=enabled),
        Tenant("clinic", "Clinic", allow_base_model=True, adapters={"scribe": "medical"}),
    ]
    records = [ApiKey(id="k1", tenant_id="acme", sha256=keys.hash_key(key))]
    return TenantRegistry(tenants, records, catalog, base_model_id="base"), key


def test_keys_are_random_and_only_their_hash_is_compared() -> None:
    first, second = keys.generate_key(), keys.generate_key()
    assert first != second and first.startswith(keys.KEY_PREFIX)
    assert len(keys.hash_key(first)) == 64 and keys.hash_key(first) != first
    assert keys.display_prefix(first) == first[: keys.DISPLAY_PREFIX_LEN]


def test_authenticate(catalog: AdapterCatalog) -> None:
    registry, key = make_registry(catalog)
    principal = registry.authenticate(key)
    assert principal.tenant.id == "acme" and principal.key_id == "k1"
    for bad in (None, "", key + "x", keys.generate_key()):
        with pytest.raises(AuthenticationError):
            registry.authenticate(bad)


def test_disabled_tenant_is_refused(catalog: AdapterCatalog) -> None:
    registry, key = make_registry(catalog, enabled=False)
    with pytest.raises(PermissionDeniedError):
        registry.authenticate(key)


def test_resolve_only_granted_aliases(catalog: AdapterCatalog) -> None:
    registry, _ = make_registry(catalog)
    acme = registry._tenants["acme"]
    clinic = registry._tenants["clinic"]
    target = registry.resolve(acme, "my-legal")
    assert target.adapter is not None and target.adapter.name == "legal"
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


def test_changed_adapter_content_is_a_new_version(tmp_path: Path) -> None:
    write_adapter(tmp_path, "legal", weights=b"v1")
    catalog = AdapterCatalog(tmp_path, max_rank=32)
    catalog.scan()
    first = catalog.get("legal")
    catalog.scan()
    assert catalog.get("legal") == first
    write_adapter(tmp_path, "legal", weights=b"v2")
    catalog.scan()
    second = catalog.get("legal")
    assert first is not None and second is not None
    assert second.sha256 != first.sha256
    assert second.lora_id != first.lora_id
    assert second.engine_name != first.engine_name


def test_unservable_adapters_are_skipped(tmp_path: Path) -> None:
    write_adapter(tmp_path, "too-big", rank=64)
    (write_adapter(tmp_path, "pickled") / "adapter_model.safetensors").rename(
        tmp_path / "pickled" / "adapter_model.bin"
    )
    write_adapter(tmp_path, "ok")
    catalog = AdapterCatalog(tmp_path, max_rank=32)
    catalog.scan()
    assert [a.name for a in catalog] == ["ok"]
    with pytest.raises(AdapterError, match="rank 64"):
        read_lora_config(tmp_path / "too-big", 32)


def test_manifests_and_issued_keys(tmp_path: Path) -> None:
    tenants_dir = tmp_path / "tenants"
    tenants_dir.mkdir()
    (tenants_dir / "a.yaml").write_text(
        "id: acme\nname: ACME\nadapters: {legal: legal_advisor}\n"
        f"api_keys: [{{id: k1, sha256: '{'a' * 64}'}}]\n"
    )
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(f"- {{id: k2, tenant_id: acme, sha256: '{'b' * 64}'}}\n")
    tenants, records = load_tenants(tenants_dir, keys_file)
    assert tenants == [Tenant("acme", "ACME", adapters={"legal": "legal_advisor"})]
    assert [(k.id, k.tenant_id) for k in records] == [("k1", "acme"), ("k2", "acme")]

    keys_file.write_text(f"- {{id: k3, tenant_id: ghost, sha256: '{'c' * 64}'}}\n")
    with pytest.raises(ManifestError, match="unknown tenant"):
        load_tenants(tenants_dir, keys_file)
    (tenants_dir / "b.yaml").write_text("id: acme\nname: Again\n")
    with pytest.raises(ManifestError, match="defined twice"):
        load_tenants(tenants_dir, tmp_path / "none.yaml")
    (tenants_dir / "b.yaml").write_text("id: Bad Id!\nname: x\n")
    with pytest.raises(ManifestError):
        load_tenants(tenants_dir, tmp_path / "none.yaml")


def test_repository_demo_manifests_load() -> None:
    tenants, _ = load_tenants(Path("tenants"), Path("/nonexistent"))
    by_id = {t.id: t for t in tenants}
    assert set(by_id) == {"acme-legal", "st-marys", "callcenter", "demo-all"}
    assert by_id["demo-all"].allow_base_model
    assert not by_id["acme-legal"].allow_base_model
