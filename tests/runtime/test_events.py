"""The event kinds `umemc events --kind` accepts are every kind the code records: read from the source of
umemc itself (each EventLog.add / _event / emit call with a literal kind, and the kinds given by name)."""

from __future__ import annotations

import ast
from pathlib import Path

from umemc.runtime.events import KINDS

PACKAGE = Path(__file__).resolve().parents[2] / "umemc"
# kinds passed in a variable (why="lease_release" and the like): the literals at their call sites
BY_NAME = {"lease_release", "lease_expire", "ttl_unload"}


def recorded_kinds() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add", "_event", "emit")
            ):
                for arg in node.args[:2]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.isidentifier():
                        found.add(arg.value)
    return found


def test_every_recorded_kind_is_listed() -> None:
    assert recorded_kinds() - set(KINDS) == set()
    assert set(KINDS) - recorded_kinds() == BY_NAME
    assert BY_NAME <= set(KINDS)
    for kind in BY_NAME:  # and each named kind really is written somewhere
        assert any(f'"{kind}"' in p.read_text() for p in PACKAGE.rglob("*.py")), kind
