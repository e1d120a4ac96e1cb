"""``lora-gateway``: serve, and operate the store (adapters, tenants, keys, the admin token).

Setting up the demo (the embedded model, the demo adapters, the demo tenants' keys) is
tooling beside the product: ``python -m tools.demo``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from app import access_log, settings_reference
from app.settings import Settings

if TYPE_CHECKING:
    from app.admin.service import AdminService

CLI_ACTOR = "cli"


def serve(settings: Settings) -> None:
    from app import server
    from app.main import create_app

    access_log.configure(settings.log_level, settings.log_format)
    if settings.role == "engine":  # vLLM's own server with our plugins, no gateway app
        from app.engine_role.server import serve_engine

        sys.exit(serve_engine(settings))
    server.run(create_app(settings), settings)


@asynccontextmanager
async def admin_service(settings: Settings) -> AsyncIterator[AdminService]:
    """The admin service on the configured store, for commands run beside (or
    without) a gateway; running gateways pick the changes up by themselves."""
    from app.admin.service import AdminService
    from app.store.db import open_database
    from app.tenancy.base_model import BaseModelInfo

    async def nothing() -> None:
        return None

    base_model = BaseModelInfo.for_settings(settings)
    async with open_database(settings.database_url) as sessions:
        yield AdminService.from_settings(settings, sessions, base_model, on_change=nothing)


async def create_key(settings: Settings, tenant_id: str, name: str) -> str:
    """Issue a key; return the plaintext (shown once)."""
    from app.admin.schemas import KeyCreate

    async with admin_service(settings) as admin:
        _, key = await admin.create_key(CLI_ACTOR, tenant_id, KeyCreate(name=name))
    return key


async def register_adapter(settings: Settings, name: str, path: str) -> str:
    async with admin_service(settings) as admin:
        row = await admin.register_adapter(CLI_ACTOR, name, partial(admin.storage.from_path, path))
    return f"adapter {row.name} v{row.version} sha256={row.sha256[:12]} rank={row.rank}"


async def apply_tenants(settings: Settings, directory: Path, prune: bool) -> list[str]:
    from app.admin.manifests import apply_manifests
    from app.admin.schemas import check_grant_alias
    from app.tenancy.manifests import load_manifests

    manifests = load_manifests(directory)
    for manifest in manifests:
        for alias in manifest.adapters:
            check_grant_alias(alias, settings.base_model_id)
    async with admin_service(settings) as admin:
        return await apply_manifests(admin, CLI_ACTOR, manifests, prune=prune)


def admin_token(settings: Settings) -> None:
    """Make sure an admin token exists: the setting, or a generated token file."""
    if settings.admin_tokens():
        where = "LORA_GATEWAY_ADMIN_TOKEN" if settings.admin_token else settings.admin_token_file
        print(f"admin token: see {where}")
        return
    write_secret(settings.admin_token_file, "lgw-admin-" + secrets.token_urlsafe(32))
    print(f"admin token: generated into {settings.admin_token_file} (mode 0600)")


def write_secret(path: Path, content: str) -> None:
    """Write ``content`` to ``path``, readable by its owner only (mode 0600 from the start)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(content)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lora-gateway",
        description="Multi-tenant, OpenAI-compatible LoRA gateway over one vLLM engine.",
        epilog=settings_reference.help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("serve", help="start the gateway (HTTPS when a TLS cert and key are set)")
    adapters_cmd = commands.add_parser("adapters", help="adapter versions in the store")
    adapter_actions = adapters_cmd.add_subparsers(dest="action", required=True, metavar="ACTION")
    register = adapter_actions.add_parser(
        "register", help="register a directory under the adapter root as a new version"
    )
    register.add_argument("name", help="adapter name")
    register.add_argument("path", nargs="?", help="directory relative to the adapter root")
    tenants_cmd = commands.add_parser("tenants", help="tenants in the store")
    tenant_actions = tenants_cmd.add_subparsers(dest="action", required=True, metavar="ACTION")
    apply = tenant_actions.add_parser(
        "apply", help="apply tenant manifests (tenants, flags, grants) idempotently"
    )
    apply.add_argument("directory", nargs="?", type=Path, help="default: the tenants_dir setting")
    apply.add_argument("--prune", action="store_true", help="delete tenants not in the manifests")
    keys_cmd = commands.add_parser("keys", help="tenant API keys")
    key_actions = keys_cmd.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = key_actions.add_parser("create", help="issue an API key (printed once)")
    create.add_argument("tenant", help="tenant id")
    create.add_argument("--name", default="", help="a label for the key")
    commands.add_parser("admin-token", help="generate the admin token file if no token is set")
    settings_cmd = commands.add_parser(
        "settings", help="print the effective settings as JSON (--reference: every setting)"
    )
    settings_cmd.add_argument(
        "--reference",
        action="store_true",
        help="print every setting's variable, type, default and description as Markdown "
        "(docs/settings.md) instead",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from app.errors import GatewayError
    from app.tenancy.adapters import AdapterError
    from app.tenancy.manifests import ManifestError

    args = build_parser().parse_args(argv)
    if args.command == "settings" and args.reference:
        # The class's defaults, never the environment's: no Settings() to read (or fail on).
        sys.stdout.write(settings_reference.render())
        return 0
    try:
        run(args, Settings())
    except GatewayError as exc:
        print(f"lora-gateway: {exc.message}", file=sys.stderr)
        return 1
    except (AdapterError, ManifestError) as exc:
        print(f"lora-gateway: {exc}", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace, settings: Settings) -> None:
    if args.command == "serve":
        serve(settings)
    elif args.command == "adapters":
        print(asyncio.run(register_adapter(settings, args.name, args.path or args.name)))
    elif args.command == "tenants":
        directory = args.directory or settings.tenants_dir
        for change in asyncio.run(apply_tenants(settings, directory, args.prune)) or ["no change"]:
            print(f"{directory}: {change}")
    elif args.command == "keys":
        print(asyncio.run(create_key(settings, args.tenant, args.name)))
    elif args.command == "admin-token":
        admin_token(settings)
    elif args.command == "settings":
        print(settings.model_dump_json(indent=2))


if __name__ == "__main__":
    sys.exit(main())
