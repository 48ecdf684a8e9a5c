"""The app code stays small enough to take over: no module over 500 lines, no function over 60 lines
(docstring included), and no block of six or more logic lines written twice.

"App code" is every package of the project (core, chat, scheduling, api, plugins, console, maibot)
without migrations. A repeated block is six consecutive logic lines, compared with blanks, comments,
docstrings, imports and closing brackets left out, that appear twice anywhere in app code. Declarations
are not logic and are left out too: the fields of a class body (model and schema field lists) and a
function's signature. Each check also runs on a small sample, so it is known to be able to fail.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.static  # never the database: the PostgreSQL suite leaves it out

ROOT = Path(__file__).resolve().parent.parent
APPS = ["core", "maibot", "chat", "scheduling", "api", "plugins", "console"]
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
BLOCK = 6
_CLOSERS = {")", "]", "}", "),", "],", "},", "else:", "try:", "finally:", "pass", "continue", "break", "return"}


def _app_modules() -> dict[str, str]:
    found = {}
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts:
                found[str(path.relative_to(ROOT))] = path.read_text()
    return found


def _long_modules(sources: dict[str, str]) -> list[str]:
    return [f"{name}: {n} lines" for name, text in sources.items() if (n := len(text.splitlines())) > MAX_MODULE_LINES]


def _long_functions(sources: dict[str, str]) -> list[str]:
    out = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text, name)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return out


def _left_out(tree: ast.Module) -> set[int]:
    """Line numbers that are not logic: docstrings, imports, class-body declarations, signatures."""
    lines: set[int] = set()

    def span(node: ast.AST) -> range:
        return range(node.lineno, node.end_lineno + 1)

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                lines.update(span(first))
        if isinstance(node, ast.Import | ast.ImportFrom):
            lines.update(span(node))
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.Assign | ast.AnnAssign):
                    lines.update(span(statement))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines.update(range(node.lineno, node.body[0].lineno))
    return lines


def _repeated_blocks(sources: dict[str, str]) -> list[str]:
    seen: dict[str, list[str]] = defaultdict(list)
    for name, text in sources.items():
        skip = _left_out(ast.parse(text, name))
        logic = [
            (number, " ".join(line.split()))
            for number, line in enumerate(text.splitlines(), 1)
            if number not in skip and line.strip() and not line.strip().startswith("#") and line.strip() not in _CLOSERS
        ]
        for i in range(len(logic) - BLOCK + 1):
            window = logic[i : i + BLOCK]
            seen["\n".join(line for _, line in window)].append(f"{name}:{window[0][0]}")
    return sorted({" = ".join(places) for places in seen.values() if len(places) > 1})


def test_no_module_over_500_lines():
    assert _long_modules(_app_modules()) == []


def test_no_function_over_60_lines():
    assert _long_functions(_app_modules()) == []


def test_no_logic_block_written_twice():
    assert _repeated_blocks(_app_modules()) == []


def test_the_checks_can_fail():
    body = "\n".join(f"    total += {i} * weight" for i in range(BLOCK))
    twice = f"def a(weight):\n    total = 0\n{body}\n    return total\n\n\ndef b(weight):\n    total = 1\n{body}\n"
    declared = "class A:\n" + "".join(f"    f{i} = Field({i})\n" for i in range(BLOCK))
    assert _repeated_blocks({"x.py": twice}) == ["x.py:3 = x.py:14"]
    assert _repeated_blocks({"x.py": declared, "y.py": declared}) == []
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert _long_functions({"x.py": long_function}) == [f"x.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]
    assert _long_modules({"x.py": "x = 1\n" * (MAX_MODULE_LINES + 1)}) == [f"x.py: {MAX_MODULE_LINES + 1} lines"]
