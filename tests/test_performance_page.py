"""docs/performance.md's targets table has exactly one row for each target declared in
bench/targets.py, in one machine-readable shape: the target's id first, then the target, the
figure with its interval, the verdict, the machine, the date and the command."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from bench.targets import DECLARED_TARGETS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
COLUMNS = ["id", "target", "figure [95% interval]", "verdict", "machine", "date", "command (run)"]
VERDICTS = re.compile(r"(met|\*\*missed\*\*)( \((resolved|unresolved)\))?|not yet measured")
_ROW_ID = re.compile(r"^\| `([a-z0-9.\-]+)` \|")


def cells(line: str) -> list[str]:
    """A table row's cells (GFM: ``\\|`` inside a cell is not a separator)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def target_rows(page: str) -> dict[str, list[list[str]]]:
    """Every row whose first cell is a code span, by that id (a list: ids may repeat)."""
    rows: dict[str, list[list[str]]] = {}
    for line in page.splitlines():
        if match := _ROW_ID.match(line):
            rows.setdefault(match.group(1), []).append(cells(line))
    return rows


def test_the_declared_ids_are_unique() -> None:
    counts = Counter(target.id for target in DECLARED_TARGETS)
    assert [name for name, count in counts.items() if count > 1] == []


def test_the_table_has_the_stable_header() -> None:
    header = next(line for line in PAGE.read_text().splitlines() if line.startswith("| id |"))
    assert cells(header) == COLUMNS


def test_each_declared_target_has_exactly_one_row_and_no_row_is_undeclared() -> None:
    rows = target_rows(PAGE.read_text())
    declared = [target.id for target in DECLARED_TARGETS]
    assert sorted(rows) == sorted(declared)
    assert {name: len(found) for name, found in rows.items() if len(found) != 1} == {}


def test_each_row_has_its_verdict_and_what_reproduces_it() -> None:
    for name, [row] in target_rows(PAGE.read_text()).items():
        assert len(row) == len(COLUMNS), name
        _, target, figure, verdict, machine, date, command = row
        assert VERDICTS.fullmatch(verdict), (name, verdict)
        assert target and command, name
        if verdict == "not yet measured":
            assert figure == "not yet measured", name
        else:
            assert figure and machine, name
            assert re.search(r"20\d\d-\d\d-\d\d|as filed in #\d+", date), (name, date)


def test_a_missing_and_a_doubled_row_are_found() -> None:
    first, second = DECLARED_TARGETS[0].id, DECLARED_TARGETS[1].id
    row = "| `{}` | t | 1x | met | AMD | 2026-12-06 | `make bench` |"
    rows = target_rows("\n".join([row.format(first), row.format(first), "| `x` | |"]))
    assert sorted(rows) == sorted([first, "x"]) and len(rows[first]) == 2
    assert second not in rows
