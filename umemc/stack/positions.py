"""Where each key and value of a TOML document sits (line, column).

The TOML parser (tomli, held at TOML 1.0: tomllib's grammar) gives positions only for syntax errors. A
valid document that fails validation still needs `FILE:LINE:COL` for the offending key, so this module
scans the text once more and records the position of every key, value, table header and array item,
addressed by the same path tuples pydantic reports in `loc` (strings for keys, ints for array items).

The scanner runs only on text that the parser has already accepted, so it may be lenient about
syntax; what it must get right is the line and column, which tests check against tomllib's own
error positions (tests/stack/test_positions.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple

Path = tuple[str | int, ...]

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class Pos(NamedTuple):
    line: int
    col: int


@dataclass
class PositionIndex:
    keys: dict[Path, Pos] = field(default_factory=dict)
    values: dict[Path, Pos] = field(default_factory=dict)
    tables: dict[Path, Pos] = field(default_factory=dict)

    def of_key(self, path: Path) -> Pos:
        """The key itself (for unknown keys); falls back to the nearest known ancestor."""
        return self._find(path, (self.keys, self.tables, self.values))

    def of_value(self, path: Path) -> Pos:
        """The value (for wrong types and ranges); falls back to the key, then the ancestors."""
        return self._find(path, (self.values, self.keys, self.tables))

    def of_table(self, path: Path) -> Pos:
        """The header of the table at `path` (for missing keys)."""
        return self._find(path, (self.tables, self.keys))

    def _find(self, path: Path, maps: tuple[dict[Path, Pos], ...]) -> Pos:
        while path:
            for m in maps:
                if path in m:
                    return m[path]
            path = path[:-1]
        return Pos(1, 1)


def scan(text: str) -> PositionIndex:
    return _Scanner(text).document()


class _Scanner:
    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.index = PositionIndex()
        self.line_starts = [0] + [n + 1 for n, ch in enumerate(text) if ch == "\n"]
        self.array_tables: dict[Path, int] = {}

    # -- positions -----------------------------------------------------------------------
    def pos(self, offset: int | None = None) -> Pos:
        offset = self.i if offset is None else offset
        line = bisect.bisect_right(self.line_starts, offset)
        return Pos(line, offset - self.line_starts[line - 1] + 1)

    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    # -- whitespace ----------------------------------------------------------------------
    def skip_ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def skip_ws_comments_newlines(self) -> None:
        while self.i < len(self.s):
            ch = self.s[self.i]
            if ch in " \t\r\n":
                self.i += 1
            elif ch == "#":
                self.skip_comment()
            else:
                return

    def skip_comment(self) -> None:
        end = self.s.find("\n", self.i)
        self.i = len(self.s) if end < 0 else end

    # -- document ------------------------------------------------------------------------
    def document(self) -> PositionIndex:
        table: Path = ()
        while True:
            self.skip_ws_comments_newlines()
            if self.i >= len(self.s):
                return self.index
            if self.peek() == "[":
                table = self.header()
            else:
                self.keyval(table)
            self.skip_ws()
            if self.peek() == "#":
                self.skip_comment()

    def header(self) -> Path:
        start = self.pos()
        is_array = self.peek(2) == "[["
        self.i += 2 if is_array else 1
        self.skip_ws()
        segments = self.key_segments()
        self.skip_ws()
        self.i += 2 if is_array else 1
        path: Path = ()
        for n, (name, seg_pos) in enumerate(segments):
            path = path + (name,)
            last = n == len(segments) - 1
            if last and is_array:
                count = self.array_tables.get(path, 0)
                self.array_tables[path] = count + 1
                self.index.keys.setdefault(path, seg_pos)
                path = path + (count,)
            elif path in self.array_tables:
                self.index.keys.setdefault(path, seg_pos)
                path = path + (self.array_tables[path] - 1,)
            self.index.keys.setdefault(path, seg_pos)
            if last:
                self.index.tables[path] = start
            else:
                self.index.tables.setdefault(path, start)
        return path

    def keyval(self, table: Path) -> None:
        path = table
        for name, seg_pos in self.key_segments():
            path = path + (name,)
            self.index.keys.setdefault(path, seg_pos)
            self.index.tables.setdefault(path, seg_pos)
        self.skip_ws()
        self.i += 1  # '='
        self.skip_ws()
        self.value(path)

    def key_segments(self) -> list[tuple[str, Pos]]:
        segments = []
        while True:
            self.skip_ws()
            seg_pos = self.pos()
            ch = self.peek()
            if ch == '"':
                name = self.basic_string()
            elif ch == "'":
                name = self.literal_string()
            else:
                start = self.i
                while self.i < len(self.s) and self.s[self.i] in _BARE:
                    self.i += 1
                name = self.s[start : self.i]
            segments.append((name, seg_pos))
            self.skip_ws()
            if self.peek() != ".":
                return segments
            self.i += 1

    # -- values --------------------------------------------------------------------------
    def value(self, path: Path) -> None:
        self.index.values[path] = self.pos()
        if path not in self.index.keys:  # array items have no key: point at the value
            self.index.keys[path] = self.index.values[path]
        ch = self.peek()
        if self.peek(3) in ('"""', "'''"):
            self.multiline_string(self.peek(3))
        elif ch == '"':
            self.basic_string()
        elif ch == "'":
            self.literal_string()
        elif ch == "[":
            self.array(path)
        elif ch == "{":
            self.inline_table(path)
        else:
            while self.i < len(self.s) and self.s[self.i] not in ",]}#\n":
                self.i += 1

    def basic_string(self) -> str:
        self.i += 1
        out = []
        while self.i < len(self.s) and self.s[self.i] != '"':
            ch = self.s[self.i]
            if ch == "\\":
                esc = self.s[self.i + 1]
                if esc in "uU":
                    width = 4 if esc == "u" else 8
                    out.append(chr(int(self.s[self.i + 2 : self.i + 2 + width], 16)))
                    self.i += 2 + width
                    continue
                out.append(_ESCAPES.get(esc, esc))
                self.i += 2
                continue
            out.append(ch)
            self.i += 1
        self.i += 1
        return "".join(out)

    def literal_string(self) -> str:
        end = self.s.index("'", self.i + 1)
        text = self.s[self.i + 1 : end]
        self.i = end + 1
        return text

    def multiline_string(self, delim: str) -> None:
        self.i += 3
        while self.i < len(self.s):
            if delim == '"""' and self.s[self.i] == "\\":
                self.i += 2
                continue
            if self.s.startswith(delim, self.i):
                run = 3
                while run < 5 and self.s.startswith(delim[0], self.i + run):
                    run += 1  # up to two quotes may end the content itself
                self.i += run
                return
            self.i += 1

    def array(self, path: Path) -> None:
        self.i += 1
        n = 0
        while True:
            self.skip_ws_comments_newlines()
            if self.peek() == "]":
                self.i += 1
                return
            self.value(path + (n,))
            n += 1
            self.skip_ws_comments_newlines()
            if self.peek() == ",":
                self.i += 1

    def inline_table(self, path: Path) -> None:
        self.index.tables.setdefault(path, self.pos())
        self.i += 1
        while True:
            self.skip_ws_comments_newlines()
            if self.peek() == "}":
                self.i += 1
                return
            self.keyval(path)
            self.skip_ws_comments_newlines()
            if self.peek() == ",":
                self.i += 1
