"""YAML text of the plain documents the Kubernetes target writes: mappings, sequences, strings, integers,
booleans and null, nothing else (no anchors, no tags, no floats). A 5000-model build writes 19,000 documents
(58 MB): PyYAML's representer spent most of the build turning them into nodes; this writes the text directly.

Every string is written plain only where every YAML reader takes it back as that same string: a conservative set
of characters, no indicator first, no ': ' or ' #', and PyYAML's own resolver (YAML 1.1, the stricter of the two
versions Kubernetes' readers speak: yes/no/on/off, 1:20, 0o17 are not strings there) calling it a string; a
multi-line string is a literal block where that is exact; anything else is double-quoted with JSON's escapes,
which YAML's double-quoted style reads alike. tests/test_yamltext.py reads every manifest back with PyYAML."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

_PLAIN = re.compile(r"(?:[A-Za-z0-9_./]|-[A-Za-z-])[A-Za-z0-9 _./:@+=,~-]*")  # "-m" is plain, "- m" and "-1" not
_BLOCK_TEXT = re.compile(r"[^\x00-\x08\x0b-\x1f\x7f\x85\u2028\u2029\ufeff]*")  # no control but \t, \n; no breaks


def dump_all(docs: Sequence[Any]) -> str:
    out: list[str] = []
    for i, doc in enumerate(docs):
        if i:
            out.append("---\n")
        if type(doc) is dict and doc:
            _mapping(doc, "", out)
        elif type(doc) in (list, tuple) and doc:
            _sequence(doc, "", out)
        else:
            out.append(_inline(doc, "") + "\n")
    return "".join(out)


# the documents are built of dicts and lists (types compared exactly: an ABC's isinstance check was a third of
# the time)


def _mapping(doc: dict[str, Any], indent: str, out: list[str]) -> None:
    deeper = indent + "  "
    for key, value in doc.items():
        kind = type(value)
        if kind is str and "\n" not in value:
            out.append(f"{indent}{_string(key)}: {_string(value)}\n")
        elif kind is int:
            out.append(f"{indent}{_string(key)}: {value}\n")
        elif kind is dict and value:
            out.append(f"{indent}{_string(key)}:\n")
            _mapping(value, deeper, out)
        elif kind in (list, tuple) and value:
            flow = _flow(value, deeper)
            if flow is not None:
                out.append(f"{indent}{_string(key)}: {flow}\n")
                continue
            out.append(f"{indent}{_string(key)}:\n")
            _sequence(value, indent, out)  # a sequence in a mapping sits at the key's indentation
        else:
            out.append(f"{indent}{_string(key)}: {_inline(value, deeper)}\n")


FLOW_FROM = 16  # a list of this many names or more is one flow sequence: [a, b, c]
FLOW_WIDTH = 100


def _flow(items: Sequence[Any], indent: str) -> str | None:
    """A long list of names (a cold model's nodes) as a flow sequence wrapped at FLOW_WIDTH, its continuation lines
    indented under the key: a fifth of the block style's bytes. None where that is not exact (any item that would
    not be plain in a flow: a comma, a bracket, a brace)."""
    if len(items) < FLOW_FROM or not all(type(x) is str and _flow_plain(x) for x in items):
        return None
    lines, line = [], "["
    for i, item in enumerate(items):
        word = item + ("]" if i == len(items) - 1 else ",")
        if len(line) + len(word) + 1 > FLOW_WIDTH and line != "[":
            lines.append(line)
            line = indent + word
        else:
            line += word if line == "[" else " " + word
    lines.append(line)
    return "\n".join(lines)


@lru_cache(maxsize=65536)
def _flow_plain(text: str) -> bool:
    return _string(text) == text and not any(c in text for c in ",[]{}")


def _sequence(items: Sequence[Any], indent: str, out: list[str]) -> None:
    deeper = indent + "  "
    if all(type(item) is str and "\n" not in item for item in items):  # argv, node names: one join
        dash = f"{indent}- "
        out.append("".join(f"{dash}{_string(item)}\n" for item in items))
        return
    cut = len(deeper)
    for item in items:
        kind = type(item)
        if kind is str and "\n" not in item:
            out.append(f"{indent}- {_string(item)}\n")
        elif kind is dict and item:
            first = len(out)
            _mapping(item, deeper, out)
            out[first] = f"{indent}- {out[first][cut:]}"  # the first key on the dash's line
        elif kind in (list, tuple) and item:
            first = len(out)
            _sequence(item, deeper, out)
            out[first] = f"{indent}- {out[first][cut:]}"
        else:
            out.append(f"{indent}- {_inline(item, deeper)}\n")


def _inline(value: Any, indent: str) -> str:
    """A value written after `key: ` or `- `: a scalar, an empty collection, or a literal block."""
    kind = type(value)
    if kind is str:
        if "\n" in value and _BLOCK_TEXT.fullmatch(value) and value[0] not in " \n":
            return _literal(value, indent)
        return _string(value)
    if kind is dict:
        assert not value
        return "{}"
    if kind in (list, tuple):
        assert not value
        return "[]"
    return _scalar(value)


def _literal(text: str, indent: str) -> str:
    """A literal block: its lines as they are, the chomping indicator saying how the text ends (strip: no line
    break at the end, clip: one, keep: more, the extra ones as empty lines)."""
    body = text.rstrip("\n")
    breaks = len(text) - len(body)
    chomp = "-" if breaks == 0 else "" if breaks == 1 else "+"
    lines = "\n".join(f"{indent}{line}" if line else "" for line in body.split("\n"))
    return f"|{chomp}\n{lines}" + "\n" * max(0, breaks - 1)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    raise TypeError(f"no YAML text for {type(value).__name__} values here")


@lru_cache(maxsize=65536)
def _string(text: str) -> str:
    """The string, plain where every reader takes it back as this string, else double-quoted (JSON's escapes)."""
    if _plain(text):
        return text
    return json.dumps(text)


def _plain(text: str) -> bool:
    if not _PLAIN.fullmatch(text) or text.endswith((" ", ":")) or ": " in text or " #" in text:
        return False
    if text.startswith(("---", "...")):  # a document's start or end at the beginning of a line
        return False
    if text[0] in "0123456789.":  # a number to some reader (YAML 1.2 reads 0o17 and 1e3 as numbers, 1.1 does not)
        return False
    if text in ("y", "Y", "n", "N"):  # booleans in YAML 1.1 (go-yaml v2, which kubectl reads with), not to PyYAML
        return False
    return _resolves_to_str(text)


def _resolves_to_str(text: str) -> bool:
    import yaml

    tag = yaml.resolver.Resolver().resolve(yaml.ScalarNode, text, (True, False))
    return bool(tag == "tag:yaml.org,2002:str")
