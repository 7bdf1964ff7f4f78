"""A versioned JSON document one umemc process writes and another (or a later run) reads: the base of the
runtime's contract (umemc.contract) and of the stack's lock file (umemc.lockfile), with the one way each is read
and written. Apart from umemc.contract so that `umemc check`, which reads lock files, does not build the
runtime's documents.

The documents are msgspec structs, not pydantic models (pydantic is the stack language's: its JSON Schema, its
messages for a person's mistakes): the runtime's long-lived processes read and write them every second, and a
process that builds no pydantic model is ~13 MiB smaller. A struct is not checked when it is built, so `dump`
checks what it writes: a file umemc writes is one it reads back, and a writer's wrong type fails where it is
written, not in the reader."""

from __future__ import annotations

import functools
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, TypeVar, dataclass_transform

import msgspec

from .errors import ContractError

__all__ = [
    "ContractError",
    "Doc",
    "Document",
    "default",
    "dump",
    "parse",
    "read",
    "read_optional",
    "validate",
    "values",
]


@dataclass_transform(kw_only_default=True, frozen_default=True)
class _DocumentMeta(msgspec.StructMeta):
    """Every document is frozen and its fields keyword-only (a field with a default may come before one without:
    fields added in a version's lifetime sit where they read best)."""

    def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kw: Any) -> Any:
        kw.setdefault("kw_only", True)
        kw.setdefault("frozen", True)
        return super().__new__(mcls, name, bases, ns, **kw)


class Document(msgspec.Struct, metaclass=_DocumentMeta, forbid_unknown_fields=True):
    # what to do with a file of another version (every document has `format` and `version` fields)
    remedy: ClassVar[str] = "rebuild it with this one (`umemc up STACK` rebuilds the bundle)"


Doc = TypeVar("Doc", bound=Document)


@functools.cache  # msgspec evaluates the class's annotations on each look (0.3 ms): the runtime reads every second
def default(kind: type[Document], name: str) -> Any:
    """The default of a document's field (a top-level document's `format` and `version`)."""
    return next(f.default for f in msgspec.structs.fields(kind) if f.name == name)


def parse(kind: type[Doc], text: str | bytes, where: str | Path) -> Doc:
    """A document of `kind` from its JSON text; ContractError says what is wrong with which file."""
    expected = str(default(kind, "format"))
    want = default(kind, "version")
    try:  # the usual file, read straight into its document (a tenth of the time; the runtime reads some each second)
        doc = msgspec.json.decode(text, type=kind)
    except (msgspec.DecodeError, RecursionError):
        pass  # read again below, to say what is wrong
    else:
        if getattr(doc, "format", None) == expected and getattr(doc, "version", None) == want:
            return doc
    try:
        raw: Any = json.loads(text)
    except ValueError as exc:
        raise ContractError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:  # arrays or objects nested past Python's recursion limit
        raise ContractError(f"{where}: nests too deep to be a {expected} file") from None
    if not isinstance(raw, dict) or raw.get("format") != expected:
        raise ContractError(f"{where}: not a {expected} file")
    version = raw.get("version")
    if version != want:
        raise ContractError(
            f"{where}: {expected} version {version!r}, but this umemc reads version "
            f"{want}: it was written by another umemc; {kind.remedy}"
        )
    try:
        return validate(kind, raw)
    except msgspec.ValidationError as exc:
        loc, msg = located(kind, raw, exc)
        raise ContractError(f"{where}: {expected} field {loc}: {msg}") from None


def validate(kind: type[Doc], raw: Any) -> Doc:
    """A document of `kind` from JSON's values (strict: "8" is no integer), or msgspec.ValidationError."""
    return msgspec.convert(raw, kind)


_AT = re.compile(r"^(.*) - at `\$(.*)`$", re.S)
_STEP = re.compile(r"\.(\w+)|\[(\d+|\.\.\.)\]")
_FIELD = re.compile(r"^Object (missing required|contains unknown) field `(.*)`$", re.S)


def located(kind: type[Document], raw: Any, exc: msgspec.ValidationError) -> tuple[str, str]:
    """(the field's dotted path, what is wrong) of a document that did not validate; msgspec's own path where the
    keys cannot be found (a shape no document has)."""
    try:
        return _where(kind, raw, str(exc))
    except (TypeError, StopIteration, IndexError, KeyError, ValueError):
        found = _AT.match(str(exc))
        return ("(the document)", str(exc)) if found is None else (found.group(2).lstrip("."), found.group(1))


def _where(kind: type[Document], raw: Any, error: str) -> tuple[str, str]:
    """(the field's dotted path, what is wrong) from msgspec's "MESSAGE - at `$.a[...].b`", the keys msgspec leaves
    out (`[...]`: a table's entry) found by validating the table's entries one by one."""
    found = _AT.match(error)
    if found is None:
        return "(the document)", error
    msg, path = found.groups()
    keys: list[str] = []
    typ: Any = kind
    for name, index in _STEP.findall(path):
        typ = _inner(typ)
        value_type: Any
        if name:
            keys.append(name)
            value_type = next(f.type for f in msgspec.structs.fields(typ) if f.name == name)
            raw = raw.get(name) if isinstance(raw, dict) else None
        elif index == "...":  # a table: its first entry that does not validate
            value_type = typing.get_args(_inner(typ))[1]
            key = _failing(raw, value_type) if isinstance(raw, dict) else None
            keys.append("?" if key is None else key)
            raw = None if key is None else raw[key]
        else:
            keys.append(index)
            value_type = typing.get_args(_inner(typ))[0]
            raw = raw[int(index)] if isinstance(raw, list) and int(index) < len(raw) else None
        typ = value_type
    field = _FIELD.match(msg)  # msgspec names a missing or unknown field in its message, at the object's path
    if field is not None:
        keys.append(field.group(2))
        msg = "Field required" if field.group(1) == "missing required" else "Not a field of this document"
    return ".".join(keys) or "(the document)", msg


def _inner(typ: Any) -> Any:
    """The type within `T | None`."""
    if typing.get_origin(typ) not in (typing.Union, types.UnionType):
        return typ
    return next(a for a in typing.get_args(typ) if a is not type(None))


def _failing(table: dict[str, Any], value_type: Any) -> str | None:
    for key, value in table.items():
        try:
            msgspec.convert(value, value_type)
        except msgspec.ValidationError:
            return key
    return None


def read(kind: type[Doc], path: Path) -> Doc:
    from .records import read_file

    try:
        text = read_file(path)
    except OSError as exc:
        raise ContractError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse(kind, text, path)


def read_optional(kind: type[Doc], path: Path) -> Doc | None:
    """A live status file that may be missing (not written yet) or corrupt: None either way."""
    try:
        return read(kind, path)
    except ContractError:
        return None


def values(doc: Document) -> dict[str, Any]:
    """The document as JSON's values (dicts, lists, numbers, strings), every field."""
    out: dict[str, Any] = msgspec.to_builtins(doc)
    return out


def dump(doc: Document, indent: int | None = None) -> str:
    """The document's JSON, checked first: what it holds must read back as the same document (a writer's float
    where the contract says an integer raises here, as ValueError naming the field)."""
    out = values(doc)
    try:
        validate(type(doc), out)
    except msgspec.ValidationError as exc:
        loc, msg = located(type(doc), out, exc)
        raise ValueError(f"{type(doc).__name__}: field {loc}: {msg}") from None
    return json.dumps(out, indent=indent, ensure_ascii=False)
