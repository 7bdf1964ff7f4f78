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
