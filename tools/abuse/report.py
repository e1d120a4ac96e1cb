"""The suite's report: a markdown table of the attack rows, one of items 4-8, and the raw
figures as JSON, written to ``var/abuse/<UTC time>/``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tools.abuse.attacks import WARM_UP
from tools.abuse.checks import CheckResult
from tools.abuse.stats import TARGET_SLACK_SECONDS, RowSummary, target_seconds

ROW_HEADER = (
    "| row | attack | victim requests (alone / attacked) | victim p99 alone (s) "
    "| victim p99 attacked (s) | target (s) | ratio attacked/alone [95% CI] "
    "| rounds meeting target | victim failures attacked | /healthz p99 attacked (s), failures "
    "| attacker's outcomes | verdict |"
)
ROW_RULE = "|---|---|---:|---:|---:|---:|---|---:|---|---|---|---|"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def outcomes(tally: dict[str, int]) -> str:
    """``429 x1204, closed x3; warm-up: 200 x1``, the most frequent first."""

    def listed(items: dict[str, int]) -> str:
        ranked = sorted(items.items(), key=lambda item: (-item[1], item[0]))
        return ", ".join(f"{name} x{count}" for name, count in ranked)

    attack = {k: v for k, v in tally.items() if not k.startswith(WARM_UP)}
    warm_up = {k.removeprefix(WARM_UP): v for k, v in tally.items() if k.startswith(WARM_UP)}
    text = listed(attack) or "none"
    if warm_up:
        text += f"; before it, spending the quota: {listed(warm_up)}"
    return text


def verdict(summary: RowSummary) -> str:
    if summary.rounds == 0:
        return "not measured"
    return "PASS" if summary.passed else "FAIL"


def row_line(summary: RowSummary, attack: str) -> str:
    failures = str(summary.victim_failures_attacked)
    if summary.victim_failure_kinds:
        kinds = ", ".join(f"{k} x{v}" for k, v in sorted(summary.victim_failure_kinds.items()))
        failures += f" ({kinds})"
    target = None if summary.solo_p99 is None else target_seconds(summary.solo_p99)
    notes = []
    if summary.unsettled_rounds:
        notes.append(f"gateway still busy after {summary.unsettled_rounds} attack(s)")
    cells = [
        summary.name,
        attack,
        f"{summary.solo_requests} / {summary.attacked_requests}",
        seconds(summary.solo_p99),
        seconds(summary.attacked_p99),
        seconds(target),
        summary.ratio.text(2),
        f"{summary.rounds_meeting_target} of {summary.rounds}",
        failures,
        f"{seconds(summary.healthz_attacked_p99)}, {summary.healthz_failures_attacked}",
        outcomes(summary.attacker),
        verdict(summary) + (f" ({'; '.join(notes)})" if notes else ""),
    ]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def rows_table(summaries: Sequence[tuple[RowSummary, str]]) -> str:
    return "\n".join([ROW_HEADER, ROW_RULE, *(row_line(s, attack) for s, attack in summaries)])


def checks_table(results: Sequence[CheckResult]) -> str:
    lines = ["| item | what | tests | result | seconds |", "|---:|---|---|---|---:|"]
    for r in results:
        tests = "<br>".join(f"`{n}`" for n in r.node_ids) or "-"
        result = r.result.upper() if r.result != "not run" else f"not run ({r.detail})"
        lines.append(f"| {r.item} | {r.title} | {tests} | {result} | {r.seconds:.0f} |")
    return "\n".join(lines)


def markdown(
    summaries: Sequence[tuple[RowSummary, str]],
    checks: Sequence[CheckResult],
    *,
    rounds: int,
    victim_requests: int,
    errors: Sequence[str],
    header: str,
) -> str:
    parts = [
        "# Abuse suite",
        "",
        header,
        "",
        f"Each row: {rounds} round(s) of {victim_requests} victim requests alone, then "
        f"{victim_requests} under attack. Target per round: p99 attacked <= max(2 x p99 alone, "
        f"p99 alone + {TARGET_SLACK_SECONDS} s); a row passes when every round meets it and "
        "no victim request failed under attack. p99 alone and attacked: the median over "
        "rounds; the ratio's interval: a bootstrap over rounds and requests (bench/stats.py). "
        "A failed victim request counts in its p99 with the time it took to fail.",
        "",
        rows_table(summaries),
    ]
    if errors:
        parts += ["", "Rows that could not be measured:", "", *(f"* {e}" for e in errors)]
    if checks:
        parts += ["", "## Items 4-8", "", checks_table(checks)]
    return "\n".join(parts) + "\n"


def write(directory: Path, text: str, raw: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.md").write_text(text)
    (directory / "raw.json").write_text(json.dumps(raw, indent=1, default=_json_default))


def _json_default(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return str(value)
