"""The abuse suite (issue #23): ``python -m tools.abuse`` (``make abuse``).

Each row starts a fresh gateway process on loopback (the stand-in engine behind the real
tokenizer for the CPU-side attacks, the real vLLM engine for the output constraints), makes
a victim tenant and an attacker over the admin API, and measures the victim's one-token chat
requests alone and under attack in ``--rounds`` interleaved rounds. Then items 4-8 run as
their tests. The table is printed and written, with the raw figures, to
``var/abuse/<UTC time>/`` (``report.md``, ``raw.json``, each gateway's log).

Exit status: 0 when every row and item passed, 1 when one failed, was not run or could not
be measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from tools.abuse import report
from tools.abuse.checks import CHECKS, CheckResult, run_check
from tools.abuse.gateway import GatewayProcess, SetupError, engine_gateway, stand_in_gateway
from tools.abuse.rows import ENGINE, ROWS, ROWS_BY_NAME, STAND_IN, Row
from tools.abuse.run import Measure, measure_row, progress
from tools.abuse.stats import RowSummary

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.abuse",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--victim-requests", type=int, default=50, help="per phase and round")
    parser.add_argument(
        "--rows", nargs="+", choices=sorted(ROWS_BY_NAME), metavar="ROW",
        help=f"a subset of the rows: {', '.join(ROWS_BY_NAME)}",
    )  # fmt: skip
    parser.add_argument(
        "--skip-engine", action="store_true", help="the CPU-side rows only (no vLLM engine)"
    )
    parser.add_argument("--skip-checks", action="store_true", help="do not run items 4-8")
    parser.add_argument(
        "--victim-timeout", type=float, default=30.0, help="seconds before a victim request fails"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "abuse")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.victim_requests < 2:
        parser.error("at least one round of two victim requests")
    return args


def selected_rows(args: argparse.Namespace) -> list[Row]:
    rows = [ROWS_BY_NAME[name] for name in args.rows] if args.rows else list(ROWS)
    return [row for row in rows if not (args.skip_engine and row.engine == ENGINE)]


@dataclass
class Measured:
    summaries: list[tuple[RowSummary, str]] = field(default_factory=list)
    raw: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, row: Row, gateway: GatewayProcess, measure: Measure) -> None:
        if not gateway.alive():
            self.errors.append(f"{row.name}: the gateway had exited before the row")
            return
        try:
            summary, rounds = measure_row(row, gateway, measure)
        except (httpx.HTTPError, OSError) as error:
            self.errors.append(f"{row.name}: {error!r}; the end of the gateway's log in raw.json")
            self.raw.append({"row": row.name, "error": repr(error), "log": gateway.log_tail()})
            return
        self.summaries.append((summary, row.attack))
        self.raw.append(
            {
                "row": row.name,
                "engine": row.engine,
                "attack": row.attack,
                "attacker_quota": row.attacker_quota,
                "summary": summary.to_json(),
                "rounds": [asdict(r) for r in rounds],
            }
        )


def measure_rows(rows: list[Row], directory: Path, measure: Measure) -> Measured:
    """Each CPU-side row on a fresh stand-in gateway (seconds to start: nothing one attack
    leaves behind weighs on the next); the engine rows on one real engine (a minute to
    start), each after the last has gone quiet."""
    measured = Measured()
    for row in (r for r in rows if r.engine == STAND_IN):
        progress(f"{row.name}: starting a gateway (stand-in engine)")
        try:
            with stand_in_gateway(directory / row.name) as gateway:
                measured.add(row, gateway, measure)
        except SetupError as error:
            measured.errors.append(f"{row.name}: {error}")
    engine_rows = [r for r in rows if r.engine == ENGINE]
    if engine_rows:
        progress("starting a gateway with the real engine")
        try:
            with engine_gateway(directory / "engine") as gateway:
                for row in engine_rows:
                    measured.add(row, gateway, measure)
        except SetupError as error:
            measured.errors += [f"{row.name}: {error}" for row in engine_rows]
    for line in measured.errors:
        progress(f"not measured: {line}")
    return measured


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    directory = args.out / stamp
    measure = Measure(args.rounds, args.victim_requests, args.victim_timeout)
    measured = measure_rows(selected_rows(args), directory, measure)
    summaries, errors = measured.summaries, measured.errors
    checks: list[CheckResult] = []
    if not args.skip_checks:
        for check in CHECKS:
            progress(f"item {check.item}: {' '.join(check.node_ids) or '(no test named)'}")
            checks.append(run_check(check, ROOT))
            progress(f"item {check.item}: {checks[-1].result} {checks[-1].detail}")
    machine = f"{os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}"
    # The machine may be shared: its load says what else ran beside the suite.
    load = (
        f"load average (1 min) {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    command = " ".join(["python -m tools.abuse", *(argv or sys.argv[1:])])
    header = f"{stamp}, `{command}`; {machine}; {load}."
    text = report.markdown(
        summaries,
        checks,
        rounds=args.rounds,
        victim_requests=args.victim_requests,
        errors=errors,
        header=header,
    )
    raw = {
        "time": stamp,
        "arguments": vars(args),
        "machine": machine,
        "load_average": os.getloadavg(),
        "rows": measured.raw,
        "errors": errors,
        "checks": [asdict(c) for c in checks],
    }
    report.write(directory, text, raw)
    print(text)
    print(f"written to {directory}")
    passed = all(s.passed for s, _ in summaries) and all(c.result == "pass" for c in checks)
    return 0 if passed and not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
