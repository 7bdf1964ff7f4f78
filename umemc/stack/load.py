"""TOML text -> validated, resolved stack. Every failure is one StackError with file:line:col."""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli
from pydantic import BaseModel, ValidationError

from ..catalog.runtimes import RUNTIMES
from ..chars import CONTROL
from ..errors import Location, StackError
from .models import Stack
from .positions import Path as KeyPath
from .positions import PositionIndex, scan
from .types import toml_repr


@dataclass
class Source:
    """The stack file as read: its text's position index, for locating any key path. The index is built
    on first use (an error or a warning to locate): a valid 5000-model stack is never scanned twice."""

    file: str
    text: str

    @functools.cached_property
    def index(self) -> PositionIndex:
        try:
            return scan(self.text)
        except RecursionError:
            return PositionIndex()  # nested too deeply to scan: every position falls back to 1:1

    def at(self, path: KeyPath, what: str = "value") -> Location:
        pos = {"value": self.index.of_value, "key": self.index.of_key, "table": self.index.of_table}[what](path)
        return Location(self.file, pos.line, pos.col)

    def error(self, path: KeyPath, message: str, hint: str | None = None, what: str = "value") -> StackError:
        return StackError(self.at(path, what), dotted(path), message, hint)

    def warning(self, path: KeyPath, message: str, what: str = "value") -> str:
        where = self.at(path, what)
        return f"{where.file}:{where.line}:{where.col}: {dotted(path)}: {message}"


@dataclass
class Document:
    path: Path
    source: Source
    data: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def close_matches(word: str, options: Iterable[str], cutoff: float = 0.6) -> list[str]:
    """The option nearest a mistyped word, in a list of one, or none near enough (difflib's measure; imported only
    when a stack has a mistake to explain)."""
    import difflib

    return difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)


def dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            seg = part if _BARE_KEY.fullmatch(part) else toml_repr(part)
            out += f".{seg}" if out else seg
    return out


MAX_STACK_BYTES = 4 * 1024 * 1024  # a stack file is a few KiB; /dev/zero is not one


def read_document(path: Path, shown: str | None = None) -> Document:
    """Read and parse; TOML syntax errors keep the parser's own line and column."""
    shown = shown or str(path)
    raw = _read_regular(path, shown)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise StackError(Location(shown, line, col), "", "not valid UTF-8 (TOML files are UTF-8)") from None
    try:
        data = tomli.loads(text)
        doc = Document(path, Source(shown, text), data)
    except tomli.TOMLDecodeError as exc:
        raise _syntax_error(shown, text, exc) from None
    except RecursionError:
        raise StackError(
            Location(shown, 1, 1),
            "",
            "arrays or inline tables nested too deeply",
            "a stack file needs at most a few levels",
        ) from None
    refuse_control_characters(doc.source, data)
    return doc


def _read_regular(path: Path, shown: str) -> bytes:
    """The file's bytes: a regular file of sane size only (a FIFO would block, /dev/zero never end)."""
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise StackError(None, "", f"{shown}: not a regular file", "give the path of a .toml stack file")
            if st.st_size > MAX_STACK_BYTES:
                raise StackError(
                    None,
                    "",
                    f"{shown}: too large for a stack file ({st.st_size} bytes; the limit is {MAX_STACK_BYTES})",
                )
            raw = f.read(MAX_STACK_BYTES + 1)
    except FileNotFoundError:
        raise StackError(None, "", f"{shown}: no such file") from None
    except IsADirectoryError:
        raise StackError(None, "", f"{shown}: is a directory", "give the path of a .toml stack file") from None
    except OSError as exc:
        raise StackError(None, "", f"{shown}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_STACK_BYTES:
        raise StackError(None, "", f"{shown}: too large for a stack file (over {MAX_STACK_BYTES} bytes)")
    return raw


def control_problem(text: str) -> str | None:
    found = CONTROL.search(text)
    if found is None:
        return None
    code = ord(found.group())
    name = _CONTROL_NAMES.get(code)
    return f"contains a control character (U+{code:04X}{', ' + name if name else ''})"


_CONTROL_NAMES = {
    0: "NUL",
    9: "a tab",
    10: "a newline",
    13: "a carriage return",
    0x1B: "escape",
    0x7F: "DEL",
    0x85: "next line",
    0x2028: "line separator",
    0x2029: "paragraph separator",
}


MAX_DEPTH = 16


def refuse_control_characters(source: Source, data: Any, path: KeyPath = ()) -> None:
    """Every key and string value of the document, checked before anything else reads it."""
    hint = (
        "generated files (supervisord.conf, sysctl.d, env files) are line-based: newlines, tabs "
        "and other control characters cannot be carried"
    )
    if len(path) > MAX_DEPTH:
        raise source.error(path, f"nested more than {MAX_DEPTH} levels deep", "a stack file needs at most a few levels")
    if isinstance(data, dict):
        for key, value in data.items():
            problem = control_problem(key)
            if problem:
                raise StackError(source.at(path + (key,), "key"), dotted(path + (key,)), f"key {problem}", hint)
            refuse_control_characters(source, value, path + (key,))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            refuse_control_characters(source, item, path + (i,))
    elif isinstance(data, str):
        problem = control_problem(data)
        if problem:
            raise source.error(path, problem, hint)


_TOML_POS = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.S)


def _syntax_error(shown: str, text: str, exc: Exception) -> StackError:
    message = str(exc)
    match = _TOML_POS.match(message)
    if match:
        where = Location(shown, int(match["line"]), int(match["col"]))
        message = match["msg"]
    else:  # "(at end of document)"
        lines = text.split("\n")
        where = Location(shown, len(lines), len(lines[-1]) + 1)
        message = message.replace(" (at end of document)", "")
    return StackError(where, "", f"TOML syntax error: {message[:1].lower()}{message[1:]}")


def validate(doc: Document) -> Stack:
    try:
        return Stack.model_validate(doc.data)
    except ValidationError as exc:
        raise convert_validation_error(exc, doc.source, Stack, doc.data) from None


# -- pydantic error -> one StackError ----------------------------------------------------------

_TYPE_NAMES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}
_COMPARE = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_RANK = {"extra_forbidden": 0, "missing": 2}  # unknown keys first: `[plaform]` beats "platform missing"


MAX_ERRORS = 20  # a stack's errors said at once; beyond, how many more


def convert_validation_error(
    exc: ValidationError, source: Source, root: type[BaseModel], data: dict[str, Any] | None = None
) -> StackError:
    """Every independent error of the document, each located: the first by rank (an unknown key before a missing
    one: `[plaform]` explains "platform missing"), then the others in the file's order. One per key path; a
    required key missing beside an unknown key that is its misspelling is the same mistake, said once."""
    errors: list[Any] = list(exc.errors(include_url=False))

    def where(err: dict[str, Any]) -> tuple[int, int]:
        what = "key" if err["type"] == "extra_forbidden" else "table" if err["type"] == "missing" else "value"
        at = source.at(_loc(err, what), what)
        return at.line, at.col

    def order(err: dict[str, Any]) -> tuple[int, int, int]:
        return (_RANK.get(err["type"], 1), *where(err))

    first = min(errors, key=order)
    seen, others = {_loc(first, "value")}, []
    misspelt = [e for e in errors if e["type"] == "extra_forbidden"]
    for err in sorted(errors, key=where):
        loc = _loc(err, "value")
        if loc in seen or (err["type"] == "missing" and _misspelt(err, misspelt)):
            continue
        seen.add(loc)
        others.append(err)
    said = [_one_error(e, source, root, data or {}) for e in others[: MAX_ERRORS - 1]]
    main = _one_error(first, source, root, data or {})
    return main.with_others(said, max(0, len(others) - (MAX_ERRORS - 1))) if said else main


def _misspelt(missing: dict[str, Any], unknown: list[dict[str, Any]]) -> bool:
    """A required key missing where its table has an unknown key close to its name (its misspelling)."""
    loc = _loc(missing, "value")
    return any(
        _loc(u, "value")[:-1] == loc[:-1] and close_matches(str(loc[-1]), [str(_loc(u, "value")[-1])], cutoff=0.6)
        for u in unknown
    )


def _loc(err: dict[str, Any], what: str) -> KeyPath:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    return loc[:-1] if what == "table" else loc


def _one_error(err: dict[str, Any], source: Source, root: type[BaseModel], data: dict[str, Any]) -> StackError:
    kind, loc, ctx = err["type"], tuple(err["loc"]), err.get("ctx") or {}
    got = toml_repr(err.get("input"))
    if kind == "extra_forbidden":
        allowed = _fields_at(root, loc[:-1])
        close = close_matches(str(loc[-1]), allowed, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else (f"valid keys: {', '.join(allowed)}" if allowed else None)
        return source.error(loc, "unknown key", hint, what="key")
    if kind == "missing":
        return StackError(
            source.at(loc[:-1], "table"), dotted(loc), "required key is missing", _missing_hint(root, loc)
        )
    if kind == "literal_error" and len(loc) == 3 and loc[0] == "models" and loc[2] == "arch":
        return _arch_error(err, source, loc, data)
    if kind == "literal_error":
        return _literal_error(err, source, loc)
    if kind in _TYPE_NAMES:
        return source.error(loc, f"must be {_TYPE_NAMES[kind]} (got {got})")
    if kind in _COMPARE:
        bound = next(iter(ctx.values()))
        return source.error(loc, f"must be {_COMPARE[kind]} {bound} (got {got})")
    if kind == "string_pattern_mismatch":
        return source.error(
            loc,
            f"must match {ctx['pattern']} (got {got})",
            "lowercase letters, digits, '-' and '_', starting with a letter; it becomes a "
            "directory and supervisord program name",
        )
    if kind in ("too_short", "string_too_short"):
        return source.error(loc, "must not be empty")
    return source.error(loc, str(err["msg"]), ctx.get("hint"))


def _literal_error(err: dict[str, Any], source: Source, loc: KeyPath) -> StackError:
    expected = re.findall(r"'([^']*)'|(\d+)", err["ctx"]["expected"])
    options = [a or b for a, b in expected]
    value = err.get("input")
    if loc == ("version",):
        return source.error(loc, f"unsupported version {toml_repr(value)}", "this umemc reads version = 1")
    close = close_matches(str(value), options, cutoff=0.5) if isinstance(value, str) else []
    hint = f"did you mean '{close[0]}'?" if close else None
    return source.error(loc, f"must be one of {', '.join(options)} (got {toml_repr(value)})", hint)


def _arch_error(err: dict[str, Any], source: Source, loc: KeyPath, data: dict[str, Any]) -> StackError:
    """An unknown arch: suggest only presets the model's runtime can run (a ComfyUI model is not a
    llama-3-8b), and only a close spelling; otherwise say how to size a model without a preset."""
    from ..catalog.archs import ARCHS, family_of
    from ..catalog.runtimes import RUNTIMES_FOR

    value = err.get("input")
    table = data.get("models", {}).get(loc[1], {}) if isinstance(data.get("models"), dict) else {}
    runtime = table.get("runtime") if isinstance(table, dict) else None
    usable = [a for a in ARCHS if runtime is None or runtime in RUNTIMES_FOR.get(family_of(a), ())]
    got = toml_repr(value)
    if isinstance(value, str):  # and of the same size: a 7B is not an 8x7B
        usable_same = [a for a in usable if _size(a) == _size(value) or not _size(value)]
        close = close_matches(value.lower(), usable_same, cutoff=0.8)
    else:
        close = []
    if close:
        hint = f"did you mean '{close[0]}'?"
    else:
        hint = (
            f'no preset of that name and size{f" for {runtime}" if runtime else ""}: give model = "path/to/file" '
            '(its header is read) or memory = "..." (an explicit size)'
        )
    return source.error(loc, f"must be one of {', '.join(ARCHS)} (got {got})", hint)


_SIZE = re.compile(r"(\d+x\d+(?:\.\d+)?b|\d+(?:\.\d+)?b)(?![a-z])", re.I)


def _size(name: str) -> str | None:
    """A model name's parameter size (7b, 8x7b, 30b), its first one: 'qwen3-30b-a3b' is a 30b."""
    m = _SIZE.search(name)
    return m.group(1).lower() if m else None


def _fields_at(root: type[BaseModel], loc: KeyPath) -> list[str]:
    model: Any = root
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        info = model.model_fields.get(str(part))
        if info is None:  # a dict key (model name): step into the dict's value type
            continue
        model = _inner_model(info.annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _inner_model(annotation: Any) -> Any:
    for arg in (*getattr(annotation, "__args__", ()), annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
        inner = getattr(arg, "__args__", ())
        for sub in inner:
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                return sub
    return None


def _missing_hint(root: type[BaseModel], loc: KeyPath) -> str | None:
    hints = {
        "version": "add `version = 1` at the top of the file",
        "name": 'add `name = "my-stack"` at the top of the file',
        "platform": 'add a [platform] table with `preset = "strix-halo-128"` or `kind` and `memory`',
        "models": "add at least one [models.<name>] table",
        "runtime": f"one of {', '.join(RUNTIMES)}",
    }
    return hints.get(str(loc[-1]))
