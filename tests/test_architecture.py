"""The import rules of docs/architecture.md, checked: import-linter's contracts (pyproject.toml)
and no import cycle between any two modules of the application package. And the tests' own
layout: the tests of ``app/x/y.py`` are found under ``tests/x/``, and no two test modules share
a file name."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(component)

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles_in_the_application_package() -> None:
    # Every import counts: inside functions and under TYPE_CHECKING too.
    package = grimp.build_graph("app", cache_dir=None)
    graph = {m: package.find_modules_directly_imported_by(m) for m in package.modules}
    assert strongly_connected(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


# -- the tests mirror the code ------------------------------------------------------------------

TESTS = ROOT / "tests"
# Folders of tests/ that mirror no package of app/: the end-to-end layer (the real engine),
# helpers, the API fuzzer, and the tests of tools/, bench/ and deploy/. The tests of app/'s
# top-level modules (app/settings.py, app/server.py, ...) are modules of tests/ itself.
NOT_MIRRORING = {"e2e", "support", "fuzz", "tools", "bench", "deploy"}


def modules_of_tests(folder: Path) -> list[Path]:
    return [
        p for p in folder.rglob("*.py") if p.name.startswith("test_") or p.stem.endswith("_test")
    ]


def folders(under: Path) -> list[Path]:
    return [p for p in under.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))]


def test_no_two_test_modules_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for module in modules_of_tests(TESTS):
        by_name[module.name].append(str(module.relative_to(ROOT)))
    shared = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {}


def test_every_folder_of_tests_mirrors_a_package_of_the_application() -> None:
    app = ROOT / "app"
    stray = []
    for folder in folders(TESTS):
        if folder.name in NOT_MIRRORING:
            continue
        # tests/x/ and below, tests/x/y/ for app/x/y/: each a package of app/.
        for mirror in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
            if any(part.startswith(("_", ".")) for part in mirror.relative_to(TESTS).parts):
                continue
            package = app / mirror.relative_to(TESTS)
            if not (package / "__init__.py").is_file():
                stray.append(str(mirror.relative_to(ROOT)))
    assert stray == []


def test_every_folder_of_tests_is_a_package() -> None:
    missing = [
        str(folder.relative_to(ROOT))
        for folder in [TESTS, *TESTS.rglob("*")]
        if folder.is_dir()
        and not any(part.startswith(("_", ".")) for part in folder.relative_to(TESTS).parts)
        and any(folder.glob("*.py"))
        and not (folder / "__init__.py").is_file()
    ]
    assert missing == []


def test_what_tests_share_is_in_support_not_in_a_conftest_or_a_test_module() -> None:
    """A conftest holds fixtures and hooks; a test module holds tests: neither is imported."""
    imports_of_tests = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            last_parts = {name.rpartition(".")[2] for name in names if name.startswith("tests.")}
            if any(part == "conftest" or part.startswith("test_") for part in last_parts):
                imports_of_tests.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert imports_of_tests == []
