"""Items 4-8 of issue #23 as pass/fail rows: each is its tests, run by pytest in a process of
its own. A test that is not there (or collects nothing) is "not run", never a pass."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CHECK_TIMEOUT_SECONDS = 900
NO_TESTS_COLLECTED = 5  # pytest's exit status


@dataclass(frozen=True)
class Check:
    item: int
    title: str
    node_ids: tuple[str, ...]


# The one list of the tests behind items 4-8.
CHECKS = (
    Check(
        4,
        "a quota reply lost in flight charges nothing and holds nothing",
        ("tests/quota/test_lost_replies.py",),
    ),
    Check(
        5,
        "a pathological output constraint is a 400 before the engine, in both roles",
        ("tests/serving/preparation/test_constraint_limits.py",),
    ),
    Check(
        6,
        "a tenant id used again names a new tenant (usage, quota, cache salt)",
        ("tests/serving/test_tenant_reuse.py", "tests/store/test_store_tenant_reuse.py"),
    ),
    Check(
        7,
        "vLLM's processes never outlive the engine role's launcher",
        ("tests/engine_role/test_parent_death.py",),
    ),
    Check(
        8,
        "a client leaving the front role aborts the request in vLLM's server",
        (
            "tests/e2e/scale_out/test_front.py::"
            "test_a_client_that_leaves_stops_the_engine_and_is_charged_what_it_produced",
        ),
    ),
)


@dataclass(frozen=True)
class CheckResult:
    item: int
    title: str
    node_ids: tuple[str, ...]
    result: str  # pass | fail | not run
    seconds: float
    detail: str


def missing(node_ids: tuple[str, ...], root: Path) -> list[str]:
    """The node ids whose file is not there."""
    return [n for n in node_ids if not (root / n.split("::", 1)[0]).is_file()]


def run_check(check: Check, root: Path, python: str = sys.executable) -> CheckResult:
    absent = missing(check.node_ids, root)
    if not check.node_ids or absent:
        detail = f"missing: {', '.join(absent)}" if absent else "no test named"
        return CheckResult(check.item, check.title, check.node_ids, "not run", 0.0, detail)
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *check.node_ids]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=root, capture_output=True, text=True, timeout=CHECK_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired:
        seconds = time.monotonic() - started
        detail = f"timed out after {CHECK_TIMEOUT_SECONDS} s"
        return CheckResult(check.item, check.title, check.node_ids, "fail", seconds, detail)
    seconds = time.monotonic() - started
    # pytest's last line of output is its summary ("3 passed in 2.1s"); stderr has warnings.
    lines = done.stdout.strip().splitlines() or done.stderr.strip().splitlines()
    summary = lines[-1] if lines else ""
    if done.returncode == NO_TESTS_COLLECTED:
        result = "not run"
    else:
        result = "pass" if done.returncode == 0 else "fail"
    return CheckResult(check.item, check.title, check.node_ids, result, seconds, summary)
