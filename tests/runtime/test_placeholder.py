"""The --simulate placeholder answers like an OpenAI-compatible server: streamed chunks carry id and
created, the model is answered as asked (an alias stays the alias), and a client that resets the
connection is one log line, not a traceback. A real process on a real port."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.runtime.conftest import free_port


@pytest.fixture
def placeholder() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "umemc.runtime.placeholder", "--model", "chat", "--bytes", "0", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("umemc placeholder for chat")  # listening next
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the placeholder never listened"
                time.sleep(0.05)
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_stream_chunks_carry_id_created_and_the_model_as_asked(placeholder) -> None:  # type: ignore[no-untyped-def]
    port, _ = placeholder
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body))
    raw = conn.getresponse().read().decode()
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    assert len(chunks) == 4 and raw.rstrip().endswith("data: [DONE]")
    for c in chunks:
        assert set(c) == {"id", "object", "created", "model", "choices"}
        assert (c["object"], c["model"], c["id"]) == ("chat.completion.chunk", "gpt-4o-mini", chunks[0]["id"])
        assert isinstance(c["created"], int) and abs(c["created"] - time.time()) < 60
    conn.request("POST", "/v1/completions", body=json.dumps({"model": "gpt-4o-mini", "prompt": "x"}))
    assert json.loads(conn.getresponse().read())["model"] == "gpt-4o-mini"
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "x"}))
    assert json.loads(conn.getresponse().read())["model"] == "chat"  # no model asked: the worker's own


def test_a_client_reset_is_not_a_traceback(placeholder) -> None:  # type: ignore[no-untyped-def]
    port, proc = placeholder
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", port))
        body = json.dumps({"prompt": "x", "delay": 0.3}).encode()
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        s.close()
    time.sleep(1.0)  # the three delayed replies are written into reset connections
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "x"}))
    assert conn.getresponse().status == 200  # and it still serves
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err
