"""The position index must agree with tomllib's own line/column numbering. tomllib reports
positions only for syntax errors, so each recorded position is checked by corrupting the
document exactly there and asking tomllib where the error is."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from umemc.stack.positions import Pos, scan

REPO = Path(__file__).resolve().parents[2]

TRICKY = '''# comment with [brackets] and = signs
title = "a # not a comment"   # trailing comment
"quoted key" = 'literal \\ string'
dotted.key.path = 1
multi = """
line one "quoted"
line two \\
  continued"""
lit = \'\'\'
raw \\n ''\'\'\'
arr = [
  1, # one
  [2, 3],
  { x = "é", y = [4] },
]
date = 1979-05-27 07:32:00Z
inline = { a = 1, b.c = "x", "d e" = { f = true } }
unicode = "Ünïcødé ✓"

[table . sub]   # spaced header
k = -1.5e3

[[arrtab]]
name = "first"
[[arrtab]]
name = "second"
[arrtab.child]
deep = 0x1F
'''


def _tomllib_position(text: str) -> tuple[int, int]:
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        assert m, str(exc)
        return int(m.group(1)), int(m.group(2))
    raise AssertionError("the corrupted document still parsed")


def _corrupt(text: str, pos: Pos) -> str:
    lines = text.split("\n")
    line = lines[pos.line - 1]
    lines[pos.line - 1] = line[: pos.col - 1] + "@" + line[pos.col :]
    return "\n".join(lines)


def _documents() -> list[tuple[str, str]]:
    docs = [("tricky", TRICKY)]
    docs += [(p.name, p.read_text()) for p in sorted((REPO / "examples").glob("*.toml"))]
    return docs


@pytest.mark.parametrize("name,text", _documents(), ids=[n for n, _ in _documents()])
def test_value_positions_match_tomllib(name: str, text: str) -> None:
    index = scan(text)
    assert index.values, "nothing indexed"
    for path, pos in index.values.items():
        assert _tomllib_position(_corrupt(text, pos)) == (pos.line, pos.col), path


@pytest.mark.parametrize("name,text", _documents(), ids=[n for n, _ in _documents()])
def test_key_positions_match_tomllib(name: str, text: str) -> None:
    index = scan(text)
    for path, pos in index.keys.items():
        if path in index.values and index.values[path] == pos:
            continue  # array items: their "key" is the value itself
        assert _tomllib_position(_corrupt(text, pos)) == (pos.line, pos.col), path


def test_paths_cover_tables_arrays_and_inline_tables() -> None:
    index = scan(TRICKY)
    assert index.values[("arr", 2, "y", 0)] == Pos(14, 19)
    assert index.values[("inline", "b", "c")] == Pos(17, 25)
    assert index.values[("inline", "d e", "f")] == Pos(17, 44)
    assert index.keys[("table", "sub", "k")] == Pos(21, 1)
    assert index.tables[("table", "sub")] == Pos(20, 1)
    assert index.values[("arrtab", 1, "name")] == Pos(26, 8)
    assert index.values[("arrtab", 1, "child", "deep")] == Pos(28, 8)
    assert index.values[("unicode",)] == Pos(18, 11)
    assert index.of_value(("arrtab", 1, "child", "nothing")) == Pos(27, 9)  # the nearest ancestor: its header key
    assert index.of_table(()) == Pos(1, 1)
