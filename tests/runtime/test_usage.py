"""The gateway's reading of tokens from what the workers answer (umemc.runtime.gateway.usage), on answers the
two llama.cpp servers really sent (tests/recorded/answers, README there): the figures are the ones in those
files, read by eye."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

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


def test_a_count_is_digits_and_the_last_one_says() -> None:
    """A token count with a sign is no count (the one before it stands); a rate keeps its sign, fraction and exponent;
    an answer that says a figure twice (a stream's chunks) is read by its last saying."""
    data = b'{"usage": {"prompt_tokens": 4}} {"usage": {"prompt_tokens": -2, "completion_tokens": 7}}'
    assert read_usage(data) == Usage(4, 7, None, "usage")
    data = b'{"timings": {"predicted_n": 8, "predicted_per_second": 1.25e2, "prompt_n": 3, "cache_n": 2}}'
    assert read_usage(data) == Usage(5, 8, 125.0, "timings")


def test_the_access_log_rotates_and_never_fails_a_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from umemc.runtime.gateway.access import AccessLog

    log = AccessLog(tmp_path / "logs" / "access.log", max_bytes=200)  # a line is ~55 bytes
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


def test_the_access_log_writes_the_lines_of_the_moment_together(tmp_path: Path) -> None:
    """Under a running loop the lines wait for the flush (FLUSH_S later, in one go); the gateway's end writes those
    still waiting; past MAX_PENDING waiting lines they are written at once."""
    import asyncio
    import time
    from datetime import datetime, timedelta

    from umemc.runtime.gateway import access

    path = tmp_path / "access.log"

    async def run() -> list[list[int]]:
        log = access.AccessLog(path)
        seen = []
        before = time.time()
        log.write({"n": 0})
        log.write({"n": 1})
        after = time.time()
        seen.append([json.loads(x)["n"] for x in path.read_text().splitlines()] if path.exists() else [])
        flushed = asyncio.Event()
        asyncio.get_running_loop().call_later(access.FLUSH_S, flushed.set)  # scheduled after the log's own flush
        await flushed.wait()
        seen.append([json.loads(x)["n"] for x in path.read_text().splitlines()])
        for line in path.read_text().splitlines():  # each line says when it was answered, to the millisecond, in UTC
            stamp = datetime.fromisoformat(json.loads(line)["time"])
            assert stamp.utcoffset() == timedelta(0) and before - 0.001 <= stamp.timestamp() <= after
        for n in range(2, 2 + access.MAX_PENDING):
            log.write({"n": n})
        seen.append([json.loads(x)["n"] for x in path.read_text().splitlines()])
        log.write({"n": "last"})
        log.close()
        seen.append([json.loads(x)["n"] for x in path.read_text().splitlines()][-2:])
        return seen

    before, after, full, end = asyncio.run(run())
    assert (before, after) == ([], [0, 1])
    assert full == list(range(2 + access.MAX_PENDING))
    assert end == [access.MAX_PENDING + 1, "last"]


def test_the_requests_figures_read_as_prometheus_clients_own_series() -> None:
    """The request path keeps its figures in plain numbers; what a scrape shows of them is what prometheus-client's
    own Counter and Histogram show for the same requests (every bucket, count and sum; the library's _created
    samples aside)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from umemc.runtime.gateway import metrics

    stack = SimpleNamespace(models={"m": None, "quiet": None}, generation=SimpleNamespace(capacity=None))
    kept = metrics.Metrics(stack)  # type: ignore[arg-type]
    ours = CollectorRegistry()
    ours.register(kept.answers)  # its series of the requests alone (the live gauges need a running gateway)
    theirs = CollectorRegistry()
    requests = Counter("umemc_requests", "", ["model", "code"], registry=theirs)
    latency = Histogram(
        "umemc_request_duration_seconds", "", ["model"], buckets=metrics.LATENCY_BUCKETS, registry=theirs
    )
    tokens = Counter("umemc_tokens", "", ["model", "direction"], registry=theirs)
    latency.labels("quiet")  # a model of the stack shows its (empty) series before its first request
    # at a bound (0.01: in its bucket), between, past the last bound
    for code, seconds, usage in ((200, 0.01, Usage(2, 3)), (200, 0.3, Usage(1, None)), (503, 700.0, None)):
        kept.request("m", code, seconds, usage)
        requests.labels("m", str(code)).inc()
        latency.labels("m").observe(seconds)
        for direction, n in (("in", usage and usage.tokens_in), ("out", usage and usage.tokens_out)):
            if n:
                tokens.labels("m", direction).inc(n)
    kept.request("nobody", 404, 0.001)
    requests.labels("nobody", "404").inc()

    def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if not s.name.endswith("_created") and not s.name.startswith(("umemc_queue", "umemc_generation"))
        }

    got = samples(ours)
    assert got == samples(theirs)
    assert got[("umemc_request_duration_seconds_bucket", (("le", "0.01"), ("model", "m")))] == 1
    assert got[("umemc_request_duration_seconds_count", (("model", "quiet"),))] == 0
    assert got[("umemc_tokens_total", (("direction", "in"), ("model", "m")))] == 3


def test_the_ledger_keeps_requests_until_they_settle_in_order(tmp_path: Path) -> None:
    """Under a running loop an answered request is only kept; SETTLE_S later (or when a reader settles first) it is in
    the history, the metrics and the access log, in the order the requests ended."""
    import asyncio
    from datetime import datetime

    from umemc.runtime.gateway import ledger as ledger_module
    from umemc.runtime.gateway import metrics
    from umemc.runtime.gateway.access import AccessLog
    from umemc.runtime.gateway.history import Requests

    stack = SimpleNamespace(models={"m": None}, generation=SimpleNamespace(capacity=None))
    kept = metrics.Metrics(stack)  # type: ignore[arg-type]
    history, log = Requests(), AccessLog(tmp_path / "access.log")
    book = ledger_module.Ledger(history)
    book.attach(kept, log)
    ends = [1796400000.25, 1796400000.5]
    entries = [
        ledger_module.Entry(
            ends[0],
            "m",
            "POST",
            "/v1/chat/completions",
            200,
            0.123456,
            0.0,
            0.0,
            Usage(3, 5, 99.0, "timings", 250.0),
            99.0,
            True,
            None,
        ),
        ledger_module.Entry(
            ends[1],
            "m",
            "POST",
            "/v1/embeddings",
            503,
            2.5,
            1.25,
            0.5,
            Usage(),
            None,
            False,
            "queue_timeout",
            granted=False,
        ),
    ]

    async def run() -> tuple[int, int]:
        for e in entries:
            book.add(e)
        before = len(history.items), kept.answers.requests.get(("m", "200"), 0)
        settled = asyncio.Event()
        asyncio.get_running_loop().call_later(ledger_module.SETTLE_S, settled.set)
        await settled.wait()
        return before

    assert asyncio.run(run()) == (0, 0)
    assert [(a.t, a.status, a.tokens_out, a.tokens_per_s, a.prompt_per_s) for a in history.items] == [
        (ends[0], 200, 5, 99.0, 250.0),
        (ends[1], 503, None, None, None),
    ]
    assert kept.answers.requests == {("m", "200"): 1, ("m", "503"): 1}
    # only a request that held a slot says how long it waited for one (the refused one never had one)
    waits = kept.answers.queue_wait.by_model["m"]
    assert (waits[0], sum(waits[:-1]), waits[-1]) == (1, 1, 0.0)
    lines = [json.loads(x) for x in (tmp_path / "access.log").read_text().splitlines()]
    assert [datetime.fromisoformat(x.pop("time")).timestamp() for x in lines] == ends
    assert lines == [
        {"model": "m", "method": "POST", "path": "/v1/chat/completions", "status": 200, "queue_wait_s": 0.0,
         "latency_s": 0.1235, "tokens_in": 3, "tokens_out": 5, "tokens_per_s": 99.0, "tokens_from": "timings",
         "stream": True},
        {"model": "m", "method": "POST", "path": "/v1/embeddings", "status": 503, "queue_wait_s": 1.25,
         "latency_s": 2.5, "tokens_in": None, "tokens_out": None, "tokens_per_s": None, "tokens_from": None,
         "stream": False, "generation_wait_s": 0.5, "error": "queue_timeout"},
    ]  # fmt: skip


def test_anthropic_messages_count_what_the_cache_read_as_input() -> None:
    """Anthropic's usage counts the prompt's cached tokens apart: "cache_read_input_tokens":30, "input_tokens":1,
    "output_tokens":8 is 31 in, 8 out (llama-server's own answer to /v1/messages, no timings in it)."""
    assert read_usage((ANSWERS / "llama-server-messages.json").read_bytes()) == Usage(31, 8, None, "usage")


@pytest.mark.parametrize("piece", [7, 4096, 100_000])
def test_an_anthropic_stream_says_its_input_first_and_its_output_last(piece: int) -> None:
    """message_start (its first event) says "cache_read_input_tokens":24,"input_tokens":15; message_delta (near its
    end) "output_tokens":200; the 24 KB between are 200 text deltas: the input is read from the stream's first
    lines, never from its tail."""
    data = (ANSWERS / "llama-server-messages-stream.txt").read_bytes()
    assert len(data) > TAIL + 4096
    reader = read_in_pieces(data, piece)
    assert reader.usage() == Usage(39, 200, None, "usage")
    assert reader.chunks == 200  # each text_delta, where a stream said no usage


def test_the_responses_api_counts_cached_tokens_inside_its_input() -> None:
    """The Responses API's "input_tokens":31 already holds its "cached_tokens":24; its stream's last event,
    response.completed, carries usage and llama-server's timings ("predicted_n":200, its own speed)."""
    assert read_usage((ANSWERS / "llama-server-responses.json").read_bytes()) == Usage(31, 8, None, "usage")
    reader = read_in_pieces((ANSWERS / "llama-server-responses-stream.txt").read_bytes(), 512)
    assert reader.usage() == Usage(39, 200, 68.16674613744608, "usage", 140.3141165355509)
    assert reader.chunks == 200  # each response.output_text.delta
