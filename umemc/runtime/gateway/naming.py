"""Answers name the model the client asked for: a worker says its own name for itself (llama-server says the GGUF's
file name, or the path it was given; llama-cpp-python's server the path), and a client that asked for "gemma3" or
for an alias matches the answer to its request. Every `"model": ...` (and llama-server's `"model_path": ...`) in
a relayed JSON answer or event stream is rewritten to the asked name, on the bytes, without parsing the answer.

Why a byte pattern is safe here: a JSON key is a string between unescaped quotes, and a quote inside a string value
is escaped (`\\"`), so `"model"` followed by a colon cannot match inside generated text; the value pattern takes
escaped characters whole, so it ends at the value's own closing quote."""

from __future__ import annotations

import json
import re
from functools import lru_cache

KEY_VALUE = re.compile(rb'("(?:model|model_path)"\s*:\s*)"(?:[^"\\]|\\.)*"')


def renamed(data: bytes, name: str) -> bytes:
    """`data` (a whole JSON answer, or whole lines of an event stream) with every model field saying `name`."""
    return _rename(data, _value(name))


@lru_cache(maxsize=256)  # a stack's names and aliases: one encoding each, not one a request
def _value(name: str) -> bytes:
    """`name` as the JSON string that goes after the key."""
    return json.dumps(name).encode()


def _rename(data: bytes, value: bytes) -> bytes:
    """Each match's key kept, its value replaced, the rest as it was (joined once: re.sub with a template expands
    the template in Python at every match)."""
    if b'"model' not in data:
        return data
    out: list[bytes] = []
    last = 0
    for found in KEY_VALUE.finditer(data):
        out += (data[last : found.end(1)], value)
        last = found.end()
    if not out:
        return data
    out.append(data[last:])
    return b"".join(out)


CARRY_LIMIT = 16 * 1024  # the most of a line (or of a body without lines) held back for a field cut across pieces
# what a cut in the middle of a line keeps back: room for a model field's key and its value (a path, PATH_MAX long)
FIELD_ROOM = 4096 + 64
_KEY = b'"model'


class StreamRenamer:
    """The same for a stream that arrives in pieces: each piece is passed on up to its last line end at once (an
    event stream's events end with one); a line cut across two pieces waits for its end, so a field is never split
    where the pattern cannot see it. A line longer than CARRY_LIMIT (a worker that never ends one), or a body read as
    it comes without lines (`lines=False`: a large JSON answer), is passed on up to a cut that splits no model field,
    keeping FIELD_ROOM bytes back: what is held is bounded, and each piece costs its own size plus that bound."""

    def __init__(self, name: str, *, lines: bool = True):
        self.value, self.carry, self.lines = _value(name), b"", lines

    def feed(self, chunk: bytes) -> bytes:
        data = self.carry + chunk if self.carry else chunk
        cut = data.rfind(b"\n") + 1 if self.lines else 0
        if cut == len(data):  # the usual piece: whole events
            self.carry = b""
            return _rename(data, self.value)
        if len(data) - cut > CARRY_LIMIT or not self.lines:
            cut = max(cut, _field_cut(data))
        self.carry = data[cut:]
        return _rename(data[:cut], self.value) if cut else b""

    def rest(self) -> bytes:
        data, self.carry = self.carry, b""
        return _rename(data, self.value)


def _field_cut(data: bytes) -> int:
    """Where `data` may be cut so that every model field before the cut is whole in it: FIELD_ROOM bytes from its end,
    moved back to the start of a field (or of a key's first bytes) that the cut would split."""
    cut = len(data) - FIELD_ROOM
    if cut <= 0:
        return 0
    key = data.rfind(_KEY, max(0, cut - FIELD_ROOM), cut)
    if key >= 0:
        whole = KEY_VALUE.match(data, key)
        if whole is None or whole.end() > cut:
            cut = key
    quote = data.rfind(b'"', max(0, cut - len(_KEY) + 1), cut)  # `"mod` | `el": …`: a key begun before the cut
    if quote >= 0 and _KEY.startswith(data[quote:cut]) and _opens_key(data, quote):
        cut = quote
    return cut


def _opens_key(data: bytes, quote: int) -> bool:
    """Whether the quote at `quote` can open an object's key: after `{` or `,` (or whitespace after them), not the
    closing quote of a value."""
    before = data[max(0, quote - 64) : quote].rstrip()
    return not before or before.endswith((b"{", b","))


def error_message(data: bytes, limit: int = 500) -> str:
    """What an error answer says: OpenAI's `{"error": {"message": …}}`, Ollama's `{"error": "…"}`, else the body
    (cut at `limit` characters where it is no JSON)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return data.decode(errors="replace")[:limit]
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err if err is not None else doc)
