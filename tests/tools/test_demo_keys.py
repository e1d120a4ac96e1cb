"""``python -m tools.demo keys``: one key per tenant manifest, issued once, kept private."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from app.cli import apply_tenants
from app.errors import GatewayError
from app.settings import Settings
from tools.demo.keys import demo_tenants, issue_demo_keys


def write_manifests(directory: Path, *tenants: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for tenant in tenants:
        (directory / f"{tenant}.yaml").write_text(f"id: {tenant}\nname: {tenant.title()}\n")
    return directory


def settings_for(tmp_path: Path, tenants_dir: Path) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        tenants_dir=tenants_dir,
    )


def test_the_demo_tenants_are_the_manifests_in_tenants() -> None:
    declared = sorted(
        line.removeprefix("id: ").strip()
        for path in Path("tenants").glob("*.yaml")
        for line in path.read_text().splitlines()
        if line.startswith("id: ")
    )
    assert demo_tenants(Path("tenants")) == declared
    assert "acme-legal" in declared


async def test_one_key_per_manifest_once_readable_by_the_owner_only(tmp_path: Path) -> None:
    manifests = write_manifests(tmp_path / "tenants", "alpha", "beta")
    settings = settings_for(tmp_path, manifests)
    await apply_tenants(settings, manifests, prune=False)
    keys_file = tmp_path / "var" / "demo-keys.json"

    issued = await issue_demo_keys(settings, manifests, keys_file)

    assert issued is not None and sorted(issued) == ["alpha", "beta"]
    assert len(set(issued.values())) == 2
    assert json.loads(keys_file.read_text()) == issued
    assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600
    write_manifests(manifests, "gamma")
    assert await issue_demo_keys(settings, manifests, keys_file) is None
    assert json.loads(keys_file.read_text()) == issued


async def test_a_tenant_not_in_the_store_is_refused_and_nothing_written(tmp_path: Path) -> None:
    manifests = write_manifests(tmp_path / "tenants", "alpha")
    settings = settings_for(tmp_path, manifests)
    await apply_tenants(settings, manifests, prune=False)
    write_manifests(manifests, "not-applied")
    keys_file = tmp_path / "demo-keys.json"

    with pytest.raises(GatewayError, match="not-applied"):
        await issue_demo_keys(settings, manifests, keys_file)
    assert not keys_file.exists()
