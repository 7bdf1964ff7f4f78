"""Rules for the tests themselves, read from their syntax trees.

A test whose every assertion says something is absent (`not in`, `is not`, `not x`) passes as well when the code
under it does nothing at all: an empty log holds no traceback, a missing file no secret. Each such test also
asserts something that is there (what the code did, an exact value), so that doing nothing fails it."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def absent_only(test: ast.Assert) -> bool:
    t = test.test
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
        return True
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.NotIn, ast.IsNot)):
        return True
    return (
        isinstance(t, ast.BoolOp)
        and isinstance(t.op, ast.And)
        and all(absent_only(ast.Assert(test=v)) for v in t.values)
    )


def absence_only_tests(tree: ast.AST) -> list[tuple[int, str]]:
    """Test functions whose assertions all say something is absent (and that expect no exception: a
    `with pytest.raises` is a positive line)."""
    out = []
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")):
            continue
        asserts = [n for n in ast.walk(fn) if isinstance(n, ast.Assert)]
        if asserts and all(map(absent_only, asserts)) and not any(isinstance(n, ast.With) for n in ast.walk(fn)):
            out.append((fn.lineno, fn.name))
    return out


def test_every_absence_has_a_positive_line_beside_it() -> None:
    found = [
        f"{path.relative_to(TESTS)}:{line}: {name}"
        for path in sorted(TESTS.rglob("test_*.py"))
        for line, name in absence_only_tests(ast.parse(path.read_text()))
    ]
    assert found == []


def test_the_rule_reads_what_it_means() -> None:
    code = """
def test_absent(log):
    assert "Traceback" not in log and not errors

def test_also_present(log):
    assert "Traceback" not in log
    assert "started" in log

def test_raises():
    with pytest.raises(ValueError):
        parse("x")
    assert not leftovers

def helper():
    assert x is not None
"""
    assert absence_only_tests(ast.parse(code)) == [(2, "test_absent")]
