"""The suite's own layout: no test module imports another, and what several wings share
lives in tests/support.

A test module that imports another drags that module's tests, fixtures and imports
into its own; a helper kept in one wing and imported by others is found by nobody
looking in tests/support. Programs the tests run keep their own package
(`tests.kubeapi`, the test API server).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SHARED = "support"
PROGRAMS = frozenset({"kubeapi"})  # run as `python -m tests.kubeapi`, and imported


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(TESTS.rglob("*.py")):
        yield ".".join(("tests", *path.relative_to(TESTS).with_suffix("").parts)), path


def _imports(path: Path) -> Iterator[str]:
    """The `tests.*` modules a file imports (`from tests.a.b import c`: tests.a.b, and
    tests.a.b.c in case c is a module)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from tests.a import test_b` imports the module tests.a.test_b
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        yield from (name for name in names if name.startswith("tests."))


def _wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_test_module_imports_another() -> None:
    found = [
        f"{module} imports {imported}"
        for module, path in _modules()
        for imported in _imports(path)
        if imported.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert not found, found


def test_what_several_wings_share_lives_in_support() -> None:
    found = [
        f"{module} imports {imported}: move it to tests/{SHARED}"
        for module, path in _modules()
        for imported in _imports(path)
        if _wing(imported) not in {_wing(module), SHARED, *PROGRAMS}
    ]
    assert not found, found
