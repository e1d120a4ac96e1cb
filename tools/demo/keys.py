"""The demo tenants' API keys: one per tenant manifest, issued once into ``var/demo-keys.json``.

The demo tenants are the tenants the manifests declare (``tenants/*.yaml``), so adding a
manifest adds a demo tenant without touching code.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import create_key, write_secret
from app.settings import Settings
from app.tenancy.manifests import load_manifests

DEMO_KEYS_FILE = Path("var/demo-keys.json")
KEY_NAME = "demo"


def demo_tenants(directory: Path) -> list[str]:
    """The ids of the tenants the manifests in ``directory`` declare, in file-name order."""
    return [manifest.id for manifest in load_manifests(directory)]


async def issue_demo_keys(
    settings: Settings, tenants_dir: Path, keys_file: Path = DEMO_KEYS_FILE
) -> dict[str, str] | None:
    """Issue one key per demo tenant into ``keys_file`` (mode 0600), once: None, and nothing
    issued, when the file exists. The tenants must be in the store (``tenants apply``)."""
    if keys_file.is_file():
        return None
    issued = {
        tenant: await create_key(settings, tenant, KEY_NAME) for tenant in demo_tenants(tenants_dir)
    }
    write_secret(keys_file, json.dumps(issued, indent=2))
    return issued
