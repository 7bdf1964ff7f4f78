"""A worker that answers badly on purpose (tests/workers/hostile.py, raw sockets) behind the real gateway, on the
OpenAI and Ollama surfaces: nothing it sends takes the gateway down. What is read whole is bounded (a 502 past it),
what can be piped is piped, a line without an end costs a bounded carry, a head without an end is cut, a reply no
translation can read is a 502 in the surface's own shape, and a stream the worker cuts after its 200 ends with an
error the client reads, never as if it were whole. Afterwards the gateway is the same process, its memory bounded,
and a good answer still comes."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.conftest import patience
from tests.runtime.conftest import Running, bring_down, bring_up, free_port, worker
from tests.runtime.test_gateway import Gateway, stack_text

pytestmark = pytest.mark.slow  # a real stack behind a real gateway

WHOLE = 64 << 20  # relay.WHOLE_LIMIT


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    models = worker("h", "hostile.py", "{port}", memory="64MiB", port=free_port())
    r = bring_up(tmp_path_factory.mktemp("hostile"), stack_text("hostile", models, slots=2, gateway=LIMITS))
    try:
        g = Gateway(r)
        FIRST.append(gateway_process(r))  # the gateway as it began: the last test finds the same process
        yield g
    finally:
        bring_down(r)


FIRST: list[psutil.Process] = []
LIMITS = 'upstream_timeout = "20s"\n'


def gateway_process(r: Running) -> psutil.Process:
    from umemc.runtime.rundir import RunDir

    record = next(x for x in RunDir(r.run_dir).records() if x.name == "umemc-gateway")
    return psutil.Process(record.pid)


def post(gw: Gateway, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=patience(60))
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def chat(mode: str, **extra: Any) -> dict[str, Any]:
    return {"model": "h", "messages": [{"role": "user", "content": mode}], **extra}


def raw_head_and_some(gw: Gateway, path: str, body: dict[str, Any], want: int) -> tuple[bytes, int]:
    """The answer's head and how much of its body came, reading at most `want` bytes, then leaving."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=patience(60)) as s:
        s.sendall(b"POST %b HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                  b"\r\n%b" % (path.encode(), len(data), data))  # fmt: skip
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(65536)
        head, _, rest = got.partition(b"\r\n\r\n")
        size = len(rest)
        while size < want and (piece := s.recv(1 << 20)):
            size += len(piece)
    return head, size


def test_a_good_answer_first(gw: Gateway) -> None:
    status, data = post(gw, "/v1/chat/completions", chat("hello"))
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "fine"
    assert json.loads(data)["model"] == "h"


def test_a_huge_declared_answer_is_piped_not_held(gw: Gateway) -> None:
    head, size = raw_head_and_some(gw, "/v1/chat/completions", chat("huge-length"), 2 * WHOLE)
    # renamed as it comes, so sent chunked (its length may change); more than the gateway would ever hold came through
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    assert size >= 2 * WHOLE


def test_an_endless_json_answer_is_piped(gw: Gateway) -> None:
    head, size = raw_head_and_some(gw, "/v1/chat/completions", chat("endless-json"), 2 * WHOLE)
    assert head.startswith(b"HTTP/1.1 200") and size >= 2 * WHOLE


def test_ollama_refuses_to_translate_more_than_it_holds(gw: Gateway) -> None:
    status, data = post(gw, "/api/chat", chat("huge-length", stream=False))
    assert (status, json.loads(data)) == (
        502,
        {"error": f"worker h: the worker's answer is 4294967296 bytes, more than {WHOLE} read whole"},
    )
    status, data = post(gw, "/api/chat", chat("endless-json", stream=False))
    assert (status, json.loads(data)) == (
        502,
        {"error": f"worker h: the worker's answer is more than {WHOLE} bytes read whole"},
    )


def test_an_endless_error_body_is_read_only_as_far_as_its_message(gw: Gateway) -> None:
    status, data = post(gw, "/api/chat", chat("endless-500", stream=False))
    assert (status, json.loads(data)) == (
        500,
        {"error": "worker h answered 500: the worker's answer is more than 1048576 bytes read whole"},
    )


@pytest.mark.parametrize("mode", ["html", "array", "odd-choices"])
def test_a_reply_no_translation_reads_is_a_502_in_ollamas_shape(gw: Gateway, mode: str) -> None:
    status, data = post(gw, "/api/chat", chat(mode, stream=False))
    body = {"html": "<html><body>502 Bad Gateway (nginx)</body></html>", "array": "[1, 2, 3]",
            "odd-choices": '{"choices": ["not", "objects"], "model": "hostile"}'}[mode]  # fmt: skip
    assert (status, json.loads(data)) == (502, {"error": f"worker h did not answer as an OpenAI server: {body!r}"})


def test_one_unreadable_event_does_not_lose_the_stream(gw: Gateway) -> None:
    status, data = post(gw, "/api/chat", chat("bad-event", stream=True))
    lines = [json.loads(x) for x in data.splitlines()]
    assert status == 200
    assert [x["message"]["content"] for x in lines] == ["one", "two", ""]
    assert lines[-1]["done"] is True


def test_a_stream_cut_after_its_200_ends_with_an_error(gw: Gateway) -> None:
    status, data = post(gw, "/v1/chat/completions", chat("cut", stream=True))
    events = [x for x in data.split(b"\n\n") if x]
    assert status == 200 and len(events) == 3
    assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:2]] == ["one", "two"]
    error = json.loads(events[2][6:])["error"]
    assert error["type"] == "server_error" and error["message"].startswith("worker h cut its answer: ")
    status, data = post(gw, "/api/chat", chat("cut", stream=True))
    lines = [json.loads(x) for x in data.splitlines()]
    assert status == 200 and [x.get("message", {}).get("content") for x in lines[:2]] == ["one", "two"]
    assert list(lines[2]) == ["error"] and lines[2]["error"].startswith("worker h cut its answer: ")


def test_a_line_without_an_end_costs_a_bounded_carry(gw: Gateway) -> None:
    """The OpenAI stream passes it on as it comes; Ollama's translation drops a line no event can be read from, and
    the stream ends with the error of its cut end (the worker stops without ending its chunked body)."""
    head, size = raw_head_and_some(gw, "/v1/chat/completions", chat("no-newline", stream=True), 2 * WHOLE)
    assert head.startswith(b"HTTP/1.1 200") and size >= 2 * WHOLE
    status, data = post(gw, "/api/chat", chat("no-newline", stream=True))
    lines = [json.loads(x) for x in data.splitlines()]
    assert status == 200 and len(lines) == 1 and lines[0]["error"].startswith("worker h cut its answer: ")


def test_a_head_without_an_end_is_cut(gw: Gateway) -> None:
    status, data = post(gw, "/v1/chat/completions", chat("endless-header"))
    assert status == 502
    assert json.loads(data)["error"]["message"] == (
        "worker h closed the connection: the worker's answer has more than 81920 bytes of head"
    )


def test_a_workers_cookie_and_cors_never_reach_the_client(gw: Gateway) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=patience(60))
    conn.request("POST", "/v1/chat/completions", json.dumps(chat("cookie")), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert (resp.status, json.loads(resp.read())) == (200, {"model": "h", "choices": []})
    names = {k.lower() for k in resp.headers}
    assert "x-kept" in names and not names & {"set-cookie", "access-control-allow-origin",
                                              "access-control-allow-credentials"}  # fmt: skip
    conn.close()


def test_the_gateway_survived_all_of_it(gw: Gateway) -> None:
    """Same process since the start of the module (never OOM-killed and restarted), its memory bounded, answering."""
    proc = gateway_process(gw.run)
    assert (proc.pid, proc.create_time()) == (FIRST[0].pid, FIRST[0].create_time())
    assert proc.memory_info().rss < 300 << 20  # it held none of the 2 x 64 MiB streams, nor a 4 GiB body
    test_a_good_answer_first(gw)
