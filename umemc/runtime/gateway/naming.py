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

KEY_VALUE = re.compile(rb'("(?:model|model_path)"\s*:\s*)"(?:[^"\\]|\\.)*"')


def renamed(data: bytes, name: str) -> bytes:
    """`data` (a whole JSON answer, or whole lines of an event stream) with every model field saying `name`."""
    return _rename(data, _template(name))


def _template(name: str) -> bytes:
    """The substitution that puts `name` (as a JSON string) after the key: backslashes doubled for re.sub."""
    return rb"\g<1>" + json.dumps(name).encode().replace(b"\\", b"\\\\")


def _rename(data: bytes, template: bytes) -> bytes:
    return KEY_VALUE.sub(template, data) if b'"model' in data else data


class StreamRenamer:
    """The same for a stream that arrives in pieces: each piece is passed on up to its last line end at once (an
    event stream's events end with one); a line cut across two pieces waits for its end, so a field is never split
    where the pattern cannot see it."""

    def __init__(self, name: str):
        self.template, self.carry = _template(name), b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.carry + chunk if self.carry else chunk
        cut = data.rfind(b"\n") + 1
        if cut == len(data):  # the usual piece: whole events
            self.carry = b""
            return _rename(data, self.template)
        self.carry = data[cut:]
        return _rename(data[:cut], self.template) if cut else b""

    def rest(self) -> bytes:
        data, self.carry = self.carry, b""
        return _rename(data, self.template)


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
