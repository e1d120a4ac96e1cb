"""``lora-gateway``: serve, set up the embedded model and demo adapters, issue keys."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from app.settings import EMBEDDED_MODEL_DIR, Settings

DEMO_KEYS_FILE = Path("var/demo-keys.json")
DEMO_TENANTS = ("acme-legal", "st-marys", "callcenter", "demo-all")


def _settings_help() -> str:
    lines = ["settings (environment variables, also read from ./.env):"]
    for name, field in Settings.model_fields.items():
        default = field.default
        lines.append(f"  LORA_GATEWAY_{name.upper():<26} {field.description} [default: {default}]")
    return "\n".join(lines)


def serve(settings: Settings) -> None:
    import uvicorn

    from app.main import create_app

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        log_level=settings.log_level,
        timeout_graceful_shutdown=30,
    )


def prepare_model(settings: Settings, force: bool) -> None:
    from app.bootstrap.model import prepare_embedded_model

    if Path(settings.model) != EMBEDDED_MODEL_DIR:
        print(f"model: {settings.model} is not the embedded model; nothing to prepare")
        return
    prepare_embedded_model(EMBEDDED_MODEL_DIR, force=force)


def build_adapters(settings: Settings, seed: int, force: bool) -> None:
    from app.bootstrap.demo_adapters import build_demo_adapters

    build_demo_adapters(Path(settings.model), settings.adapter_root, seed=seed, force=force)


def create_key(settings: Settings, tenant_id: str, name: str) -> str:
    """Issue a key for a tenant of the manifests; return the plaintext (shown once)."""
    from app.tenancy import keys
    from app.tenancy.manifests import (
        IssuedKey,
        ManifestError,
        load_issued_keys,
        load_manifests,
        save_issued_keys,
    )

    if tenant_id not in {m.id for m in load_manifests(settings.tenants_dir)}:
        raise ManifestError(f"no tenant {tenant_id!r} in {settings.tenants_dir}")
    key = keys.generate_key()
    record = IssuedKey(
        id=keys.new_key_id(),
        tenant_id=tenant_id,
        sha256=keys.hash_key(key),
        prefix=keys.display_prefix(key),
        name=name,
    )
    save_issued_keys(settings.api_keys_file, [*load_issued_keys(settings.api_keys_file), record])
    return key


def demo_keys(settings: Settings) -> None:
    """Issue one key per demo tenant, once; later runs only say where they are."""
    if DEMO_KEYS_FILE.is_file():
        print(f"demo keys: see {DEMO_KEYS_FILE}")
        return
    issued = {tenant: create_key(settings, tenant, "demo") for tenant in DEMO_TENANTS}
    DEMO_KEYS_FILE.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(DEMO_KEYS_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(issued, out, indent=2)
    print(f"demo keys (shown once; also in {DEMO_KEYS_FILE}, mode 0600):")
    for tenant, key in issued.items():
        print(f"  {tenant:<12} {key}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lora-gateway",
        description="Multi-tenant, OpenAI-compatible LoRA gateway over one vLLM engine.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("serve", help="start the gateway (HTTPS when a TLS cert and key are set)")
    model = commands.add_parser("prepare-model", help="convert the embedded model into models/")
    model.add_argument("--force", action="store_true", help="convert again even if present")
    adapters = commands.add_parser(
        "build-demo-adapters", help="train the three demo adapters into the adapter root"
    )
    adapters.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    adapters.add_argument("--force", action="store_true", help="train again even if present")
    keys = commands.add_parser("create-key", help="issue an API key for a tenant (printed once)")
    keys.add_argument("tenant", help="tenant id from the manifests")
    keys.add_argument("--name", default="", help="a label for the key")
    commands.add_parser("demo-keys", help=f"issue the demo tenants' keys into {DEMO_KEYS_FILE}")
    commands.add_parser("settings", help="print the effective settings as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings()
    if args.command == "serve":
        serve(settings)
    elif args.command == "prepare-model":
        prepare_model(settings, args.force)
    elif args.command == "build-demo-adapters":
        build_adapters(settings, args.seed, args.force)
    elif args.command == "create-key":
        print(create_key(settings, args.tenant, args.name))
    elif args.command == "demo-keys":
        demo_keys(settings)
    elif args.command == "settings":
        print(settings.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
