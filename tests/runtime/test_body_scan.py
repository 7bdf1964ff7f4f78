"""How the gateway reads a request body before routing it (umemc.runtime.gateway.relay: model_of, strict_json): the
nesting it refuses is checked against a plain byte-by-byte scan of the body written here (the reference), on
awkward and random bodies; the messages are the API's."""

from __future__ import annotations

import json
import random

import pytest

from umemc.runtime.gateway.bodies import MAX_JSON_DEPTH, TooDeep, depth, model_of, strict_json
from umemc.runtime.gateway.model import Refused


def reference_depth(raw: bytes) -> int:
    """The deepest nesting of [ and { outside strings, one byte at a time."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == ord("\\"):
                escaped = True
            elif byte == ord('"'):
                in_string = False
        elif byte == ord('"'):
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


SCALARS = [1, -2.5, None, True, "s", 'a "quoted" [x] {y}', "back\\slash]", "\\\\", "[[[{{{", "\u00e9"]


def _random_doc(rng: random.Random, depth: int, spine: bool = True) -> object:
    """A document nesting `depth` levels along one path, with shallow siblings along the way."""
    if depth == 0:
        return rng.choice(SCALARS)
    children = [_random_doc(rng, min(depth - 1, rng.randrange(0, 3)), False) for _ in range(rng.randrange(0, 3))]
    children.insert(rng.randrange(0, len(children) + 1), _random_doc(rng, depth - 1, spine))
    if rng.random() < 0.5:
        return children
    return {f"k{i}[": child for i, child in enumerate(children)}


AWKWARD = [
    b"{}",
    b'{"model": "a"}',
    b'{"a": "\\"[[[[["}',  # an escaped quote does not end the string
    b'{"a": "\\\\", "b": [[1]]}',  # an escaped backslash does end it
    b'["' + b"[" * 100 + b'"]',  # brackets inside one string only
    b"[" * 65 + b"]" * 65,
    b"[" * 64 + b"]" * 64,
    b'[{"a": [' * 30 + b"1" + b"]}]" * 30,
]


def _verdict(raw: bytes) -> int:
    """The depth strict_json found, up to one past the limit (65: refused)."""
    try:
        return depth(strict_json(raw))
    except TooDeep:
        return MAX_JSON_DEPTH + 1


@pytest.mark.parametrize("raw", AWKWARD)
def test_the_depth_agrees_with_a_byte_by_byte_scan(raw: bytes) -> None:
    assert _verdict(raw) == min(reference_depth(raw), MAX_JSON_DEPTH + 1)


def test_the_depth_of_random_documents() -> None:
    rng = random.Random(7)
    for _ in range(400):
        doc = _random_doc(rng, rng.randrange(0, 90))
        raw = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode()
        assert _verdict(raw) == min(reference_depth(raw), MAX_JSON_DEPTH + 1), raw[:200]


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 1500 + b"]" * 1500,  # closed: counted
        b"[" * 1500,  # never closed: past the parser's own recursion limit
        b'{"model": "a", "x": ' + b"[" * 65 + b"]" * 65 + b"}",
    ],
    ids=["closed", "open", "65"],
)
def test_too_deep_is_one_message(raw: bytes) -> None:
    with pytest.raises(TooDeep) as exc:
        strict_json(raw)
    assert str(exc.value) == "request body nests more than 64 levels of arrays or objects"


@pytest.mark.parametrize(
    "raw,message",
    [
        (b'{"model": "a", "t": NaN}', "request body is not JSON"),
        (b'{"model": "a"', "request body is not JSON"),
        (b'{"model": ""}', 'request has no "model" field: name a model of this stack (GET /v1/models)'),
        (b'["a"]', 'request has no "model" field: name a model of this stack (GET /v1/models)'),
    ],
)
def test_bodies_that_do_not_route(raw: bytes, message: str) -> None:
    with pytest.raises(Refused) as exc:
        model_of("application/json", raw)
    assert exc.value.message == message


def test_a_mebibyte_prompt_routes() -> None:
    prompt = ('code: f([{x}]) "q" \\ ' * 60000)[: 1 << 20]
    body = json.dumps({"model": "big", "messages": [{"role": "user", "content": prompt}]}).encode()
    assert len(body) > 1 << 20
    assert model_of("application/json", body) == "big"


TRICKY = [
    b'{"model": "a", "model": "b"}',  # the last one counts, as in every parser the workers use
    b'{"model": 5}',
    b'{"Model": "a"}',
    b' \n{"model": "a"}\t',
    b'{"model": "a"} junk',
    b'\xef\xbb\xbf{"model": "a"}',  # a byte order mark
    '{"model": "a", "x": "é"}'.encode("utf-16"),
    '{"model": "a"}'.encode("utf-32-le"),
    b'{"model": "a", "x": "\xff\xfe"}',  # not UTF-8 where only the parser that reads every string sees it
    b'{"model": "a", "x": "\xed\xa0\x80"}',  # an encoded lone surrogate: read as strict_json reads it
    b'{"model": "a\\ud800"}',
    b'{"model": "a\\u0000"}',
    b'{"model": "a", "x": "line\nbreak"}',
    b'{"model": "a", "x": Infinity}',
    b'{"model": "a", "x": 1e999}',
    b'{"model": "a", "x": 123456789012345678901234567890}',
    b'{"model": "a",}',
    b'{"model": "a", "x": [' + b"[" * 63 + b"]" * 64 + b"}",
    b'{"model": "a", "x": "' + b"[" * 100 + b'"}',  # brackets inside a string: read whole, not refused
    b"",
]
MUTATIONS = b'{}[]":,\\ 0aeNn\xff\xed\x00\n'


def strict_outcome(raw: bytes) -> tuple[str, str]:
    """What the body routes to, or the refusal, as the whole strict parse says (json's decoder: strict_json)."""
    try:
        doc = strict_json(raw) if raw else None
    except ValueError as exc:
        return "refused", str(exc) if isinstance(exc, TooDeep) else "request body is not JSON"
    if isinstance(doc, dict) and isinstance(doc.get("model"), str) and doc["model"]:
        return "model", doc["model"]
    return "refused", 'request has no "model" field: name a model of this stack (GET /v1/models)'


def routed(raw: bytes) -> tuple[str, str]:
    try:
        return "model", model_of("application/json", raw)
    except Refused as exc:
        return "refused", exc.message


def test_the_model_is_read_as_the_whole_strict_parse_reads_it() -> None:
    """model_of reads the usual body for its model alone (msgspec); on awkward bodies, random documents and random
    mutations of them, it routes or refuses exactly as the whole strict parse does."""
    rng = random.Random(11)
    bodies = [*AWKWARD, *TRICKY]
    for _ in range(300):
        doc = {"model": rng.choice(["a", "", 5, None, "m\u00e9"]), "x": _random_doc(rng, rng.randrange(0, 70))}
        bodies.append(json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode())
    for raw in list(bodies):
        for _ in range(8):
            cut = bytearray(raw)
            for _ in range(rng.randrange(1, 4)):
                at = rng.randrange(0, len(cut) + 1)
                choice = rng.random()
                if choice < 0.4 and at < len(cut):
                    cut[at] = rng.choice(MUTATIONS)
                elif choice < 0.7:
                    cut.insert(at, rng.choice(MUTATIONS))
                elif at < len(cut):
                    del cut[at]
            bodies.append(bytes(cut))
    outcomes = {routed(raw): raw for raw in bodies}
    assert {kind for kind, _ in outcomes} == {"model", "refused"}  # both ways, many times over
    for raw in bodies:
        assert routed(raw) == strict_outcome(raw), raw[:200]
