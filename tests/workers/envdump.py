"""A worker that writes its environment to PATH (JSON) and its port's health answer, then serves.

    python envdump.py PORT PATH
"""
from __future__ import annotations

import http.server
import json
import os
import sys


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]
    with open(f"{path}.tmp", "w") as f:
        json.dump(dict(os.environ), f)
    os.replace(f"{path}.tmp", path)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
