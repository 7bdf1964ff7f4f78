"""The gateway's reading of tokens from what the workers answer (umemc.runtime.gateway.usage), on answers the
two llama.cpp servers really sent (tests/recorded/answers, README there): the figures are the ones in those
files, read by eye."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umemc.runtime.gateway.naming import StreamRenamer
from umemc.runtime.gateway.usage import TAIL, WHOLE, StreamReader, Usage, read_usage

ANSWERS = Path(__file__).resolve().parents[1] / "recorded" / "answers"


def test_a_llama_server_answer_says_usage_and_its_own_speed() -> None:
    got = read_usage((ANSWERS / "llama-server-completion.json").read_bytes())
    assert got == Usage(3, 5, 944.9562957713207, "usage", 1307.1895424836603)
    assert got.per_second(10.0) == 944.9562957713207  # its own figure, not the time the answer took


def test_a_llama_server_stream_without_usage_is_read_from_its_timings() -> None:
    # the last chunk: "cache_n":1,"prompt_n":51 (52 in), "predicted_n":5, "predicted_per_second":552.791597567717,
    # "prompt_per_second":3039.3325387365912
    got = read_usage((ANSWERS / "llama-server-stream.txt").read_bytes())
    assert got == Usage(52, 5, 552.791597567717, "timings", 3039.3325387365912)


def test_a_llama_server_stream_with_usage() -> None:
    got = read_usage((ANSWERS / "llama-server-stream-usage.txt").read_bytes())
    assert got == Usage(52, 5, 606.1524473405061, "usage", 484.49612403100775)


def test_llama_cpp_python_says_usage_without_timings() -> None:
    got = read_usage((ANSWERS / "llama-cpp-python-completion.json").read_bytes())
    assert got == Usage(3, 5, None, "usage")
    assert got.per_second(0.5) == 10.0  # 5 tokens over the half second the worker took


def read_in_pieces(data: bytes, piece: int) -> StreamReader:
    """The stream as the relay feeds it: the bytes in pieces of `piece`, cut at line ends by its renamer."""
    names, reader = StreamRenamer("asked"), StreamReader()
    for at in range(0, len(data), piece):
        if whole := names.feed(data[at : at + piece]):
            reader.feed(whole)
    if rest := names.rest():
        reader.feed(rest)
    return reader


@pytest.mark.parametrize("piece", [1, 7, 64, 100_000])
def test_a_stream_read_in_pieces_counts_each_content_chunk_once(piece: int) -> None:
    """llama-cpp-python streams one token per chunk and says no usage: its 5 content chunks (the role chunk and
    the closing empty delta are not tokens), however the bytes arrive."""
    reader = read_in_pieces((ANSWERS / "llama-cpp-python-stream.txt").read_bytes(), piece)
    assert reader.usage() == Usage(None, 5, None, "chunks")
    # llama-server's stream, fed the same way, still reads its timings (its role chunk has "content":null)
    reader = read_in_pieces((ANSWERS / "llama-server-stream.txt").read_bytes(), piece)
    assert reader.chunks == 5 and reader.usage() == Usage(52, 5, 552.791597567717, "timings", 3039.3325387365912)


def test_only_the_last_bytes_of_a_stream_are_kept() -> None:
    """A long stream keeps its last TAIL bytes (where the usage is), whatever its length."""
    reader = StreamReader()
    for i in range(2000):
        reader.feed(b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i)
    assert reader.chunks == 2000
    assert TAIL <= reader.size < TAIL + 64
    reader.feed(b'data: {"usage":{"prompt_tokens":4,"completion_tokens":2000}}\n\n')
    assert reader.usage() == Usage(4, 2000, None, "usage")


def test_a_large_answer_is_read_from_its_tail() -> None:
    vectors = [[0.125] * 1024 for _ in range(64)]  # an embeddings answer of ~0.5 MB, usage last
    body = json.dumps({"data": [{"embedding": v} for v in vectors], "usage": {"prompt_tokens": 77}}).encode()
    assert len(body) > WHOLE
    assert read_usage(body) == Usage(77, None, None, "usage")
    assert read_usage(b'{"usage": {"prompt_tokens": 9}}' + b" " * TAIL + body[-100:]) == Usage(77, None, None, "usage")


def test_an_answer_without_figures_says_none() -> None:
    assert read_usage(b'{"text": "(a transcription)"}') == Usage()
    assert Usage().per_second(1.0) is None


def test_the_access_log_rotates_and_never_fails_a_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from umemc.runtime.gateway.access import AccessLog

    log = AccessLog(tmp_path / "logs" / "access.log", max_bytes=300)
    for i in range(6):
        log.write({"model": "m", "n": i})
    log.close()
    current = [json.loads(x)["n"] for x in (tmp_path / "logs" / "access.log").read_text().splitlines()]
    older = [json.loads(x)["n"] for x in (tmp_path / "logs" / "access.log.1").read_text().splitlines()]
    assert older + current == list(range(6)) and older and current  # nothing lost at the rotation
    assert (tmp_path / "logs" / "access.log").stat().st_mode & 0o777 == 0o600
    (tmp_path / "blocked").write_text("a file where its directory should be")
    broken = AccessLog(tmp_path / "blocked" / "access.log")
    broken.write({"model": "m"})
    broken.write({"model": "m"})  # said once, not per request
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"umemc-gateway: access log {tmp_path}/blocked/access.log: ")
    assert err[0].endswith("(requests are served; not logged)")
