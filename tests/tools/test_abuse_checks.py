"""Items 4-8: each is its tests' pytest run; a test that is not there is "not run"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.abuse.checks import CHECKS, Check, run_check

ROOT = Path(__file__).resolve().parents[2]


def test_items_4_to_8_each_name_tests_that_exist() -> None:
    assert [check.item for check in CHECKS] == [4, 5, 6, 7, 8]
    for check in CHECKS:
        for node_id in check.node_ids:
            assert (ROOT / node_id.split("::")[0]).is_file(), node_id


def test_a_check_passes_fails_or_is_not_run_as_its_tests_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # These runs need no plugin; loading every installed one is most of each run's time.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    (tmp_path / "test_good.py").write_text("def test_ok():\n    assert True\n")
    (tmp_path / "test_bad.py").write_text("def test_no():\n    assert False\n")
    (tmp_path / "test_empty.py").write_text("")
    good = run_check(Check(4, "good", ("test_good.py",)), tmp_path)
    assert (good.result, good.detail) == ("pass", good.detail)
    assert "1 passed" in good.detail
    both = run_check(Check(5, "both", ("test_good.py", "test_bad.py")), tmp_path)
    assert both.result == "fail" and "1 failed" in both.detail
    assert run_check(Check(6, "empty", ("test_empty.py",)), tmp_path).result == "not run"


def test_a_check_whose_tests_are_missing_is_not_run_without_running_anything(
    tmp_path: Path,
) -> None:
    missing = run_check(Check(8, "abort", ("tests/nowhere.py::test_x",)), tmp_path)
    assert (missing.result, missing.detail) == ("not run", "missing: tests/nowhere.py::test_x")
    unnamed = run_check(Check(8, "abort", ()), tmp_path)
    assert (unnamed.result, unnamed.detail) == ("not run", "no test named")
