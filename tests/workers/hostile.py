"""A worker that answers badly on purpose, chosen by the request: the text of its last message (chat), its prompt
(completions) or the request path's last part names the misbehaviour. Raw sockets, so every byte is its own:

- huge-length: `Content-Length: 4294967296` on a JSON answer, then bytes as fast as the gateway takes them;
- endless-json: a JSON answer in chunks that never ends (no Content-Length);
- endless-500: a 500 whose chunked body never ends;
- no-newline: an event stream of bytes without a line end, for ever;
- endless-header: a header value without an end;
- html / array / odd-choices: a 200 whose body is HTML, a JSON array, `choices` that are not objects;
- cookie: a good answer that sets a cookie and allows every origin (CORS);
- cut: an event stream that starts well, then breaks its chunked encoding;
- bad-event: an event stream with one unreadable event among good ones;
- anything else: a small good chat completion.

Every endless answer stops by itself after MAX_BYTES (bounded: a test machine is no place for an infinite loop), or
when the gateway closes the connection. GET / is its health."""

from __future__ import annotations

import json
import socket
import sys
import threading

MAX_BYTES = 160 << 20  # past every bound the gateway holds (64 MiB read whole)
PIECE = b"x" * 65536


def read_request(conn: socket.socket) -> tuple[str, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            return "", b""
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next((int(v) for k, _, v in (x.partition(":") for x in lines[1:]) if k.lower() == "content-length"), 0)
    while len(body) < length:
        got = conn.recv(65536)
        if not got:
            break
        body += got
    return lines[0], body


def mode_of(line: str, body: bytes) -> str:
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        doc = {}
    if isinstance(doc, dict):
        messages = doc.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
            return str(messages[-1].get("content", ""))
        if isinstance(doc.get("prompt"), str):
            return doc["prompt"]
    return line.split(" ")[1].rsplit("/", 1)[-1] if " " in line else ""


def endless(conn: socket.socket, head: bytes, chunk: bytes, chunked: bool = True) -> None:
    conn.sendall(head)
    sent = 0
    while sent < MAX_BYTES:
        conn.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
        sent += len(chunk)


def events(conn: socket.socket, lines: list[bytes], tail: bytes = b"0\r\n\r\n") -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    for line in lines:
        conn.sendall(b"%x\r\n%b\r\n" % (len(line), line))
    conn.sendall(tail)


def chunk_event(text: str) -> bytes:
    doc = {"object": "chat.completion.chunk", "model": "hostile", "choices": [{"delta": {"content": text}}]}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def good(conn: socket.socket) -> None:
    body = json.dumps({
        "object": "chat.completion", "model": "hostile",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }).encode()  # fmt: skip
    whole(conn, b"application/json", body)


def whole(conn: socket.socket, ctype: bytes, body: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: %b\r\nContent-Length: %d\r\n\r\n" % (
        ctype,
        len(body),
    )
    conn.sendall(head + body)


def answer(conn: socket.socket) -> None:
    line, body = read_request(conn)
    if not line:
        return
    mode = mode_of(line, body)
    json_chunked = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    if line.startswith("GET / ") or line.startswith("GET /health"):
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
    elif mode == "huge-length":
        endless(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4294967296\r\n\r\n",
                PIECE, chunked=False)  # fmt: skip
    elif mode == "endless-json":
        endless(conn, json_chunked + b"1\r\n[\r\n", b"0," * 32768)
    elif mode == "endless-500":
        endless(conn, b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n", PIECE)
    elif mode == "no-newline":
        endless(conn, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
                b'data: {"model": "hostile", "x": "' + PIECE)  # fmt: skip
    elif mode == "endless-header":
        endless(conn, b"HTTP/1.1 200 OK\r\nX-Endless: ", PIECE, chunked=False)
    elif mode == "html":
        whole(conn, b"text/html", b"<html><body>502 Bad Gateway (nginx)</body></html>")
    elif mode == "cookie":
        body = b'{"model": "hostile", "choices": []}'
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     b"Set-Cookie: session=stolen; Path=/\r\nAccess-Control-Allow-Origin: *\r\n"
                     b"Access-Control-Allow-Credentials: true\r\nX-Kept: yes\r\nContent-Length: %d\r\n\r\n%b"
                     % (len(body), body))  # fmt: skip
    elif mode == "array":
        whole(conn, b"application/json", b"[1, 2, 3]")
    elif mode == "odd-choices":
        whole(conn, b"application/json", b'{"choices": ["not", "objects"], "model": "hostile"}')
    elif mode == "cut":
        events(conn, [chunk_event("one"), chunk_event("two")], tail=b"zz\r\nnot a chunk\r\n")
    elif mode == "bad-event":
        events(conn, [chunk_event("one"), b"data: [1, 2\n\n", b'data: ["an", "array"]\n\n', chunk_event("two"),
                      b"data: [DONE]\n\n"])  # fmt: skip
    else:
        good(conn)


def serve(conn: socket.socket) -> None:
    with conn:
        try:
            answer(conn)
        except OSError:  # the gateway closed the connection: what a bounded answer ends by
            pass


def main(port: int) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(64)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]))
