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
