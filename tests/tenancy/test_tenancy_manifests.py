"""Tenant manifests: what loads, and names that would fail later refused up front."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.tenancy.manifests import ManifestError, load_manifests


def test_manifests(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("id: acme\nname: ACME\nadapters: {legal: legal_advisor}\n")
    (manifest,) = load_manifests(tmp_path)
    assert manifest.id == "acme" and manifest.adapters == {"legal": "legal_advisor"}
    assert not manifest.allow_base_model and manifest.enabled
    (tmp_path / "b.yaml").write_text("id: acme\nname: Again\n")
    with pytest.raises(ManifestError, match="defined twice"):
        load_manifests(tmp_path)
    (tmp_path / "b.yaml").write_text("id: Bad Id!\nname: x\n")
    with pytest.raises(ManifestError):
        load_manifests(tmp_path)
    (tmp_path / "b.yaml").write_text("id: b\nname: x\napi_keys: [plaintext]\n")
    with pytest.raises(ManifestError, match="api_keys"):
        load_manifests(tmp_path)


def test_repository_demo_manifests_load() -> None:
    by_id = {m.id: m for m in load_manifests(Path("tenants"))}
    assert set(by_id) == {"acme-legal", "st-marys", "callcenter", "demo-all"}
    assert by_id["demo-all"].allow_base_model
    assert not by_id["acme-legal"].allow_base_model


@pytest.mark.parametrize(
    ("alias", "adapter"),
    [
        ("a" * 300, "legal_advisor"),
        ("my legal", "legal_advisor"),
        ("a,b", "legal_advisor"),
        ("org/legal", "legal_advisor"),
        ("-x", "legal_advisor"),
        ("legal", "../etc"),
    ],
)
def test_manifest_aliases_and_adapter_names_are_checked(
    tmp_path: Path, alias: str, adapter: str
) -> None:
    manifest = {"id": "acme", "name": "ACME", "adapters": {alias: adapter}}
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(ManifestError, match="adapters"):
        load_manifests(tmp_path)
