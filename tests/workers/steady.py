"""A steady test worker: allocates and touches N MiB, then answers HTTP on a port until stopped.

python steady.py PORT MIB
"""

from __future__ import annotations

import http.server
import json
import os
import sys


def main() -> None:
    port, mib = int(sys.argv[1]), int(sys.argv[2])
    held = bytearray(mib * 1024 * 1024)
    for i in range(0, len(held), 4096):  # touch every page so the memory is really resident
        held[i] = 1

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"pid": os.getpid(), "model": os.environ.get("UMEMC_MODEL"), "held_mib": mib}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"steady: holding {mib} MiB, serving on {port}", flush=True)
    print("steady: ready", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
