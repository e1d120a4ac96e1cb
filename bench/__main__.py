"""``python -m bench`` (``make bench``, ``make bench-quick``): the gateway, vLLM's OpenAI
server with our ops and vLLM's server as shipped, side by side in interleaved rounds; the
engine settings come from the environment, as for ``lora-gateway serve``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.settings import Settings
from bench.config import SYSTEMS, TARGET_SYSTEMS, BenchConfig
from bench.runner import run_bench


def _list(kind: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    return lambda text: tuple(kind(item) for item in text.split(",") if item)


def settings_pairs(text: str) -> tuple[tuple[str, str], ...]:
    """``A=1,B=2`` as ``(("A", "1"), ("B", "2"))``; anything but NAME=VALUE pairs is refused."""
    pairs = _list(str)(text)
    if bad := [pair for pair in pairs if "=" not in pair]:
        raise argparse.ArgumentTypeError(f"not NAME=VALUE: {', '.join(bad)}")
    return tuple((name, value) for name, _, value in (pair.partition("=") for pair in pairs))


def _systems(text: str) -> tuple[str, ...]:
    names = _list(str)(text)
    if unknown := set(names) - set(SYSTEMS):
        raise argparse.ArgumentTypeError(f"unknown system(s) {', '.join(sorted(unknown))}")
    return names


# option -> (type, help); each overrides the BenchConfig field of the same name.
OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "systems": (
        _systems,
        f"systems to compare, from {','.join(SYSTEMS)} (default: {','.join(TARGET_SYSTEMS)})",
    ),
    "rounds": (int, "interleaved rounds (each system once per round)"),
    "max_loras": (int, "adapters in device slots at once (every system)"),
    "adapters": (int, "a: distinct adapters"),
    "zipf": (float, "a: adapter popularity exponent"),
    "base_share": (float, "a: share of base-model requests (0-1)"),
    "output_tokens": (int, "a, c: max_tokens of every request"),
    "concurrencies": (_list(int), "a: closed-loop concurrencies, e.g. 16,64"),
    "waves": (int, "a: a closed loop sends waves x concurrency requests"),
    "curve_fractions": (_list(float), "a: open-loop rates as shares of saturation, e.g. 0.5,1"),
    "curve_requests": (int, "a: requests per open-loop rate"),
    "flood_streams": (int, "b: tenant A's concurrent streams"),
    "flood_tokens": (int, "b: max_tokens of tenant A's requests"),
    "victim_requests": (int, "b: tenant B's requests, alone and under the flood"),
    "victim_tokens": (int, "b: max_tokens of tenant B's requests"),
    "registered": (int, "c: adapters registered on the gateway (0 skips c)"),
    "registered_concurrency": (int, "c: closed-loop concurrency"),
    "registered_requests": (int, "c: requests per point"),
    "registered_max_loras": (int, "c: adapters in device slots at once (0: the concurrency)"),
    "cliff_multiples": (
        _list(int),
        "d: adapters as multiples of max_loras, e.g. 1,2,8 (empty skips d)",
    ),
    "cliff_popularities": (_list(str), "d: adapter popularities, from zipf,uniform"),
    "cliff_load": (float, "d: offered rate as a share of saturation over max_loras adapters"),
    "cliff_concurrency": (int, "d: closed-loop concurrency of that saturation"),
    "cliff_requests": (int, "d: requests per open-loop point"),
    "cliff_prompt_tokens": (int, "d: prompt length in tokens, chat template included"),
    "cliff_output_tokens": (int, "d: max_tokens of every request"),
    "gateway_settings": (
        settings_pairs,
        "more LORA_GATEWAY_* settings for the gateways, e.g. SCHEDULER_HEADROOM_SLOTS=0",
    ),
    "seed": (int, "workload and bootstrap seed"),
    "draws": (int, "bootstrap draws per interval"),
    "out": (Path, "results parent directory (default bench/results)"),
}
CONFIG_OPTIONS = tuple(OPTIONS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the gateway against vLLM's own server "
        "(engine settings from the LORA_GATEWAY_* environment).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one round of a subset: gateway and vllm, scenarios a and b, small sizes",
    )
    for name, (kind, text) in OPTIONS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    return parser


def config_from(args: argparse.Namespace) -> BenchConfig:
    """The quick or the full configuration, with the options given on the command line."""
    config = BenchConfig.quick() if args.quick else BenchConfig()
    overrides = {
        name: getattr(args, name) for name in CONFIG_OPTIONS if getattr(args, name) is not None
    }
    return replace(config, **overrides)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        config = config_from(parser.parse_args(arguments))
    except ValueError as exc:
        parser.error(str(exc))
    command = " ".join(["python -m bench", *arguments])
    asyncio.run(run_bench(config, Settings(), command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
