"""A test worker that maps a file and reads every page of it (as llama.cpp maps a model's weights), then answers HTTP
on a port until stopped.

python mapper.py PORT FILE
"""

from __future__ import annotations

import http.server
import mmap
import sys


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    total = sum(mapped[i] for i in range(0, len(mapped), 4096))  # every page resident in this process

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = str(total).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    print(f"mapper: {len(mapped)} bytes mapped and read, serving on {port}", flush=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
