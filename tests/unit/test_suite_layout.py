"""The suite's own shape: shared helpers live in tests/support, and no test module
imports another (issue #13), so a test file can move or go without breaking others."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_tests_import_shared_helpers_from_support_only() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if "support" in path.relative_to(TESTS).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [
                f"{path.relative_to(TESTS)}:{node.lineno} imports {name}"
                for name in names
                if name.startswith("tests.") and not name.startswith("tests.support")
            ]
    assert offenders == []
