"""The abuse suite's report: one table line per row with the attacker's outcomes, items 4-8
with "not run" where no test stands behind them, and the files written."""

from __future__ import annotations

import json
from pathlib import Path

from tools.abuse import report
from tools.abuse.checks import CheckResult
from tools.abuse.stats import Round, summarize
from tools.abuse.victim import VictimRequest


def requests(*seconds: float) -> list[VictimRequest]:
    return [VictimRequest(s, "200", 0.002, "200") for s in seconds]


def test_the_attackers_outcomes_are_listed_most_frequent_first_the_warm_up_apart() -> None:
    tally = {"400": 3, "429": 1204, "closed": 3, "warm-up 200": 1}
    assert report.outcomes(tally) == (
        "429 x1204, 400 x3, closed x3; before it, spending the quota: 200 x1"
    )
    assert report.outcomes({}) == "none"


def test_a_row_line_shows_the_figures_the_target_and_the_verdict() -> None:
    rounds = [Round(requests(*[0.010] * 50), requests(*[0.030] * 50), {"429": 7}, 7, 1.0)]
    line = report.row_line(summarize("tokenizer-capped", rounds), "1: 3 MB prompts | capped")
    cells = [cell.strip() for cell in line.strip("|").split(" | ")]
    assert cells[0] == "tokenizer-capped"
    assert cells[1] == "1: 3 MB prompts \\| capped"
    assert cells[2:6] == ["50 / 50", "0.010", "0.030", "0.510"]
    assert cells[6].startswith("3.00 [")
    assert cells[7:9] == ["1 of 1", "0"]
    assert cells[10] == "429 x7"
    assert cells[11] == "PASS"
    assert len(cells) == report.ROW_HEADER.count("|") - 1


def test_items_without_tests_are_not_run_never_passed(tmp_path: Path) -> None:
    checks = [
        CheckResult(4, "lost replies", ("tests/a.py",), "pass", 3.2, "2 passed"),
        CheckResult(8, "front abort", (), "not run", 0.0, "no test named"),
    ]
    text = report.markdown(
        [], checks, rounds=3, victim_requests=50, errors=["x: could not start"], header="h"
    )
    assert "| 4 | lost replies | `tests/a.py` | PASS | 3 |" in text
    assert "| 8 | front abort | - | not run (no test named) | 0 |" in text
    assert "* x: could not start" in text
    report.write(tmp_path / "run", text, {"checks": checks})
    assert (tmp_path / "run" / "report.md").read_text() == text
    raw = json.loads((tmp_path / "run" / "raw.json").read_text())
    assert raw["checks"][1]["result"] == "not run"
