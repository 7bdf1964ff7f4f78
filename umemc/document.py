"""A versioned JSON document one umemc process writes and another (or a later run) reads: the base of the
runtime's contract (umemc.contract) and of the stack's lock file (umemc.lockfile), with the one way each is read
and written. Apart from umemc.contract so that `umemc check`, which reads lock files, does not build the
runtime's documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import UmemcError


class ContractError(UmemcError):
    """A state or plan file that this umemc cannot read (exit 2): corrupt, or another version."""


class Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    # what to do with a file of another version (every document has `format` and `version` fields)
    remedy: ClassVar[str] = "rebuild it with this one (`umemc up STACK` rebuilds the bundle)"


Doc = TypeVar("Doc", bound=Document)


def parse(kind: type[Doc], text: str | bytes, where: str | Path) -> Doc:
    """A document of `kind` from its JSON text; ContractError says what is wrong with which file."""
    expected = str(kind.model_fields["format"].default)
    want = kind.model_fields["version"].default
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
        return kind.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ContractError(f"{where}: {expected} field {loc}: {first['msg']}") from None


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


def dump(doc: Document, indent: int | None = None) -> str:
    return json.dumps(doc.model_dump(mode="json"), indent=indent, ensure_ascii=False)
