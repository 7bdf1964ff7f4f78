"""Answers renamed to the model the client asked for, on the bytes: every model field, never text that only looks
like one, and a stream cut anywhere renamed as a whole."""

from __future__ import annotations

import json

import pytest

from umemc.runtime.gateway.naming import StreamRenamer, renamed

PATH = "/srv/models/gemma-3-270m-q4_k_m.gguf"
# llama-server's answer: the model's own name at the top, and generated text that quotes a "model" key
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": PATH,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": 'say {"model": "x"} and \\"model\\"'}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 5},
}


def test_a_whole_answer_names_what_was_asked_and_keeps_everything_else() -> None:
    for spacing in ((",", ":"), (", ", ": ")):  # compact and spaced JSON
        raw = json.dumps(ANSWER, separators=spacing).encode()
        assert json.loads(renamed(raw, "gemma3")) == dict(ANSWER, model="gemma3")


def test_the_props_path_and_an_escaped_name_are_replaced_too() -> None:
    raw = json.dumps({"model_path": PATH, "model_alias": "chat", "n": 1}).encode()
    assert json.loads(renamed(raw, 'we"ird\\name')) == {"model_path": 'we"ird\\name', "model_alias": "chat", "n": 1}
    raw = json.dumps({"model": 'C:\\models\\"odd".gguf'}).encode()
    assert json.loads(renamed(raw, "m")) == {"model": "m"}


def events(n: int) -> bytes:
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "model": PATH, "choices": [{"delta": {"content": f"t{i}"}}]}
        for i in range(n)
    ]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("size", [1, 7, 64, 10_000])
def test_a_stream_cut_into_any_pieces_is_renamed_whole(size: int) -> None:
    raw = events(5)
    r = StreamRenamer("gpt-4o-mini")
    out = b"".join(r.feed(raw[i : i + size]) for i in range(0, len(raw), size)) + r.rest()
    assert out == raw.replace(json.dumps(PATH).encode(), b'"gpt-4o-mini"')


def test_a_complete_line_is_passed_on_at_once() -> None:
    r = StreamRenamer("m")
    line = b'data: {"model": "x"}\n\n'
    assert r.feed(line) == b'data: {"model": "m"}\n\n'
    assert r.feed(b'data: {"mod') == b""  # waits for its line's end
    assert r.feed(b'el": "x"}\n') == b'data: {"model": "m"}\n'


def long_body(filler: int) -> bytes:
    """A JSON answer with no line end at all: a long text, a model field, a long array, the props' path."""
    return (
        b'{"content": "' + b"x" * filler + b'", "model": "' + PATH.encode() + b'", "data": ['
        + b"0.125," * filler + b'1], "model_path": "' + PATH.encode() + b'"}'
    )  # fmt: skip


@pytest.mark.parametrize("lines", [True, False])
@pytest.mark.parametrize("size", [1, 5, 4099, 65_536])
def test_a_line_without_an_end_is_passed_on_and_renamed_whole(lines: bool, size: int) -> None:
    """A worker that never ends a line (or a large JSON body read as it comes, lines=False) is passed on while it
    arrives: the renamer holds at most CARRY_LIMIT + a piece, and every field, wherever the pieces cut it, is
    renamed."""
    from umemc.runtime.gateway.naming import CARRY_LIMIT

    raw = long_body(40_000 if size > 1 else 9_000)
    r = StreamRenamer("chat", lines=lines)
    out, held = [], 0
    for i in range(0, len(raw), size):
        out.append(r.feed(raw[i : i + size]))
        held = max(held, len(r.carry))
    out.append(r.rest())
    assert b"".join(out) == raw.replace(json.dumps(PATH).encode(), b'"chat"')
    assert held <= CARRY_LIMIT + size


def test_a_key_cut_at_its_first_bytes_is_held_back() -> None:
    """`"mod` at the very end of what could be passed on: the cut moves before it, so the field is renamed."""
    from umemc.runtime.gateway.naming import FIELD_ROOM

    head = b'{"t": "' + b"y" * (2 * FIELD_ROOM) + b'", '
    for split in range(1, 7):  # the key cut after 1..6 of its bytes
        raw = head + b'"model": "' + PATH.encode() + b'"}'
        r = StreamRenamer("m", lines=False)
        cut = len(head) + split
        assert b"".join([r.feed(raw[:cut]), r.feed(raw[cut:]), r.rest()]) == head + b'"model": "m"}'
