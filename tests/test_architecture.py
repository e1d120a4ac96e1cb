"""The import rules of docs/architecture.md, checked: import-linter's contracts (pyproject.toml)
and no import cycle between any two modules of the application package."""

from __future__ import annotations

import subprocess
import sys
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
