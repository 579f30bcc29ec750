"""No function in olmo_repo/ over 80 lines (the project's rule: a reader sees a function in one screen)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "olmo_repo"
LIMIT = 80


def long_functions(root: Path = PACKAGE, limit: int = LIMIT) -> list[str]:
    """`path:line name (N lines)` of every function or method under `root` longer than `limit` lines, counted
    from its `def` (decorators aside) to its last line, docstring and comments included."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(
                        f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)"
                    )
    return found


def test_the_count_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "m.py").write_text(f"class A:\n    def short(self):\n        pass\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path) == [f"{tmp_path.name}/m.py:6 long ({LIMIT + 1} lines)"]
    assert long_functions(tmp_path, limit=LIMIT + 1) == []


def test_no_function_in_the_package_is_over_80_lines():
    assert long_functions() == []
