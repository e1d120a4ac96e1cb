"""Two checkouts' gateways side by side: their CPU per request and per streamed token, and
the ratio of each, measured in one run so that whatever else the machine does falls on both.

``python -m tools.gateway_cost.compare BASELINE`` starts the gateway of ``BASELINE`` (a
checkout's root: a ``git worktree add --detach`` of the commit to compare against) and this
checkout's, each as :mod:`tools.gateway_cost` starts its gateway, and runs the same short and
long phases on both, in turns (baseline first in odd rounds, this checkout first in even
ones). Per round, the ratio of this checkout's figure to the baseline's; printed, their median
and spread. For a change to the hot path: its before and after at the same time, on a machine
too busy for two runs at different times to compare.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from pathlib import Path

from tools.gateway_cost.__main__ import Gateway, gateway, measure, per_token_us, upstream


def _figures(gw: Gateway, streams: int, tokens: int, each: int) -> tuple[float, float]:
    short = measure(gw, streams, 1, each)
    long = measure(gw, streams, tokens, each)
    return short.cpu_per_request_us, per_token_us(short, long)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, help="the root of the checkout to compare with")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument(
        "--role", choices=("all", "front"), default="all", help="front: both over one upstream"
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of a long request")
    parser.add_argument("--requests", type=int, default=512, help="requests per phase")
    parser.add_argument("--rate", type=float, default=2000, help="tokens/s the engine makes")
    args = parser.parse_args(argv)
    pacing = [f"--rate={args.rate}"]
    each = max(1, args.requests // args.streams)
    ratios: dict[str, list[float]] = {"request": [], "token": []}
    with tempfile.TemporaryDirectory(prefix="gateway-cost-compare-") as tmp:
        workdir = Path(tmp)
        with contextlib.ExitStack() as stack:
            url = None
            if args.role == "front":
                url = stack.enter_context(upstream(workdir / "upstream", pacing))
            baseline = args.baseline.resolve()
            before = stack.enter_context(
                gateway(workdir / "baseline", pacing, upstream_url=url, checkout=baseline)
            )
            after = stack.enter_context(gateway(workdir / "this", pacing, upstream_url=url))
            for gw in (before, after):  # warm-up: first connections, lazy imports, caches
                _figures(gw, args.streams, args.tokens, 1)
            for round_number in range(1, args.rounds + 1):
                order = (before, after) if round_number % 2 else (after, before)
                figures = {id(gw): _figures(gw, args.streams, args.tokens, each) for gw in order}
                (request_before, token_before) = figures[id(before)]
                (request_after, token_after) = figures[id(after)]
                ratios["request"].append(request_after / request_before)
                ratios["token"].append(token_after / token_before)
                print(
                    f"round {round_number}: per request {request_before:.0f} -> "
                    f"{request_after:.0f} us, per token {token_before:.1f} -> "
                    f"{token_after:.1f} us"
                )
    for name, values in ratios.items():
        print(
            f"per {name}, this / baseline: {statistics.median(values):.3f} "
            f"({min(values):.3f}-{max(values):.3f}, median and min-max of {args.rounds} rounds)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
