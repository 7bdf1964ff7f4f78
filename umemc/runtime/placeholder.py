"""`umemc up --simulate` stands this in for every worker: it really allocates and touches the
worker's soft quota, serves the runtime's health URL on its port and answers OpenAI-shaped requests
with a small canned reply (streaming too), so an owner can prove the box holds the stack, and
watch the enforcer and the gateway work, before downloading the weights. A request's `"delay"`
(seconds) stands for generation time: the whole reply waits that long, or each streamed chunk
(`"chunks"`: how many, default 4).

    python -m umemc.runtime.placeholder --model NAME --bytes N [--port P --health /health]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from .memory import Held
from .probes import host


def hold(target: int) -> Held:
    """Grow this process's resident memory to about `target` bytes (the interpreter's own pages
    count too), so the worker sits just under its soft quota as a real one would."""
    own = host.processes().memory(os.getpid())
    held = Held()
    # room for the server threads and lazy imports (4 MiB), and for the page-granular growth of a large
    # hold (an 8 GiB one overshot by a few MiB): just under the soft quota at every size
    held.grow(max(0, target - own - 4 * 1024 * 1024 - target // 512))
    return held


def _reply(worker: str, model: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """worker: the stack's name of this model (said in the text); model: the name the client asked for."""
    created = int(time.time())
    if path.endswith("/embeddings"):
        inputs = body.get("input", "")
        items = inputs if isinstance(inputs, list) else [inputs]
        return {
            "object": "list",
            "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": [0.0] * 8} for i in range(len(items))],
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }
    if path.endswith("/audio/transcriptions"):
        return {"text": f"(simulated transcription by {worker})"}
    text = f"(simulated reply from {worker})"
    if path.endswith("/chat/completions"):
        return {
            "id": f"sim-{created}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
        }
    return {
        "id": f"sim-{created}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
    }


def make_handler(model: str, health: str) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in separate writes

        def _json(self, status: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in (health, "/health"):
                self._json(200, {"status": "ok", "model": model, "pid": os.getpid()})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "umemc"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw and raw.lstrip()[:1] == b"{" else {}
            except ValueError:
                body = {}
            asked = body.get("model")
            name = asked if isinstance(asked, str) and asked else model  # an alias is answered as asked
            if not self.path.startswith("/v1/"):
                self._json(404, {"error": {"message": f"no route {self.path}"}})
            elif body.get("stream"):
                self._stream(body, name)
            else:
                time.sleep(float(body.get("delay", 0)))
                self._json(200, _reply(model, name, self.path, body))

        def _stream(self, body: dict[str, Any], name: str) -> None:
            created = int(time.time())
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            words = ["(simulated", " reply", " from", f" {model})"]
            words += [" ..."] * max(0, int(body.get("chunks", 4)) - len(words))
            try:
                for i, word in enumerate(words):  # noqa: B007 - i is reported after the loop
                    delta = {
                        "id": f"sim-{created}",
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": name,
                        "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
                    }
                    self._chunk(f"data: {json.dumps(delta)}\n\n".encode())
                    time.sleep(float(body.get("delay", 0.01)))
                options = body.get("stream_options")
                if isinstance(options, dict) and options.get("include_usage"):  # OpenAI's last chunk: usage
                    tokens = {"prompt_tokens": 1, "completion_tokens": len(words), "total_tokens": 1 + len(words)}
                    last = {"id": f"sim-{created}", "object": "chat.completion.chunk", "created": created,
                            "model": name, "choices": [], "usage": tokens}  # fmt: skip
                    self._chunk(f"data: {json.dumps(last)}\n\n".encode())
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                # a real server stops generating here; said on stdout so a test can see it
                print(f"stream cancelled by the client after {i + 1} of {len(words)} chunks", flush=True)
                self.close_connection = True

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (reset, closed mid-reply) is normal for a server: one line, no traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            print(f"client {client_address[0]}:{client_address[1]} went away ({exc.__class__.__name__})", flush=True)
            return
        super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="umemc-placeholder")
    p.add_argument("--model", required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--port", type=int)
    p.add_argument("--health", default="/health")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    held = hold(args.bytes)
    print(f"umemc placeholder for {args.model}: holding {args.bytes} bytes", flush=True)
    if args.port is None:
        threading.Event().wait()
    server = QuietServer(("127.0.0.1", args.port), make_handler(args.model, args.health))
    server.daemon_threads = True
    try:
        server.serve_forever()
    finally:
        held.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
