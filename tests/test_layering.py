"""Who may import whom (DESIGN.md): the engine never imports loading, weights, plugins, node."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE_FORBIDS = ("edgefire.runtime.loading", "edgefire.runtime.weights",
                  "edgefire.runtime.plugins", "edgefire.runtime.node", "edgefire.plugins")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "runtime" / "engine").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_engine_never_imports_loading(path: Path) -> None:
    bad = {name for name in imported_modules(path)
           if any(name == f or name.startswith(f + ".") for f in ENGINE_FORBIDS)}
    assert not bad, f"runtime/engine/{path.name} imports {sorted(bad)}"
