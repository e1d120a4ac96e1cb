"""``python -m bench`` (``make bench``, ``make bench-quick``): the gateway against vLLM's own
OpenAI server on one workload; the engine settings come from the environment, as for
``lora-gateway serve``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from app.settings import Settings
from bench.runner import BenchConfig, run_bench

# The options that override a field of BenchConfig of the same name.
CONFIG_OPTIONS = (
    *("rate", "duration", "adapters", "zipf", "base_share"),
    *("sweep_duration", "output_tokens", "rounds", "sweep", "seed", "out"),
)


def adapter_counts(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(",") if n)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the gateway against vLLM's own server "
        "(engine settings from the LORA_GATEWAY_* environment).",
    )
    parser.add_argument("--quick", action="store_true", help="one short round (under 3 minutes)")
    parser.add_argument("--rate", type=float, help="offered load, requests/s (Poisson)")
    parser.add_argument("--duration", type=float, help="seconds of arrivals, main workload")
    parser.add_argument(
        "--sweep-duration", type=float, help="seconds of arrivals per adapter-sweep point"
    )
    parser.add_argument("--adapters", type=int, help="distinct adapters in the main workload")
    parser.add_argument("--zipf", type=float, help="adapter popularity exponent")
    parser.add_argument("--base-share", type=float, help="share of base-model requests (0-1)")
    parser.add_argument("--output-tokens", type=int, help="max_tokens of every request")
    parser.add_argument("--rounds", type=int, help="gateway/vLLM rounds, alternating")
    parser.add_argument(
        "--sweep", type=adapter_counts, help="adapter counts of the sweep, e.g. 1,8,32,128"
    )
    parser.add_argument("--seed", type=int, help="workload seed")
    parser.add_argument("--out", type=Path, help="results parent directory (default bench/results)")
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
    config = config_from(build_parser().parse_args(arguments))
    command = " ".join(["python -m bench", *arguments])
    asyncio.run(run_bench(config, Settings(), command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
