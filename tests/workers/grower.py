"""A worker that grows on request, as ComfyUI does when a workflow loads its models: it holds START MiB, and
`GET /grow?mib=N` makes it allocate and touch N MiB more (answered once they are resident); `GET /` answers 200.

    python grower.py PORT START_MIB
"""

from __future__ import annotations

import http.server
import json
import sys
from urllib.parse import parse_qs, urlsplit

from umemc.runtime.memory import Held


def main() -> None:
    port, start = int(sys.argv[1]), int(sys.argv[2])
    held = Held()
    held.grow(start * 2**20)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/grow":
                held.grow(int(parse_qs(url.query).get("mib", ["0"])[0]) * 2**20)
            body = json.dumps({"held_mib": held.bytes // 2**20}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
