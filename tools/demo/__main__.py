"""``python -m tools.demo``: set up the demo that ``make serve`` starts.

``model`` converts the embedded model into ``models/``, ``adapters`` trains the demo
adapters into the adapter root, ``keys`` issues the demo tenants' keys. Each is idempotent:
what is already there is kept (``--force`` makes the model or the adapters again).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from app.errors import GatewayError
from app.settings import EMBEDDED_MODEL_DIR, Settings
from app.tenancy.manifests import ManifestError
from tools.demo.embedded_model import prepare_embedded_model
from tools.demo.keys import DEMO_KEYS_FILE, issue_demo_keys
from tools.demo.training import DEMO_ADAPTERS, build_demo_adapters


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.demo",
        description="Set up the demo: the embedded model, the demo adapters, the demo keys "
        "(settings from the LORA_GATEWAY_* environment, as for lora-gateway).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    model = commands.add_parser(
        "model", help=f"convert the embedded model into {EMBEDDED_MODEL_DIR}"
    )
    model.add_argument("--force", action="store_true", help="convert again even if present")
    adapters = commands.add_parser(
        "adapters",
        help=f"train the demo adapters ({', '.join(DEMO_ADAPTERS)}) into the adapter root",
    )
    adapters.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    adapters.add_argument("--force", action="store_true", help="train again even if present")
    keys = commands.add_parser(
        "keys", help=f"issue one key per tenant manifest into {DEMO_KEYS_FILE}, once"
    )
    keys.add_argument(
        "directory",
        nargs="?",
        type=Path,
        help="tenant manifests (default: the tenants_dir setting)",
    )
    return parser


def prepare_model(settings: Settings, force: bool) -> None:
    if Path(settings.model) != EMBEDDED_MODEL_DIR:
        print(f"model: {settings.model} is not the embedded model; nothing to prepare")
        return
    prepare_embedded_model(EMBEDDED_MODEL_DIR, force=force)


def demo_keys(settings: Settings, directory: Path) -> None:
    issued = asyncio.run(issue_demo_keys(settings, directory))
    if issued is None:
        print(f"demo keys: see {DEMO_KEYS_FILE}")
        return
    print(f"demo keys (shown once; also in {DEMO_KEYS_FILE}, mode 0600):")
    for tenant, key in issued.items():
        print(f"  {tenant:<12} {key}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings()
    if args.command == "model":
        prepare_model(settings, args.force)
    elif args.command == "adapters":
        build_demo_adapters(
            Path(settings.model), settings.adapter_root, seed=args.seed, force=args.force
        )
    elif args.command == "keys":
        try:
            demo_keys(settings, args.directory or settings.tenants_dir)
        except (GatewayError, ManifestError) as exc:
            message = exc.message if isinstance(exc, GatewayError) else str(exc)
            print(f"python -m tools.demo keys: {message}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
