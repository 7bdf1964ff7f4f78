"""A worker that keeps making daemons: every 20 ms it double-forks a `setsid` grandchild that sleeps, so some
daemon is always being born while `umemc down` sweeps (the race in which one outlived `down`).

    python spawner.py PORT
"""

from __future__ import annotations

import os
import sys
import threading
import time

from _serve import serve_empty  # beside this script


def spawn_forever() -> None:
    while True:
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while True:
                    time.sleep(1)
            os._exit(0)
        os.wait()
        time.sleep(0.02)


def main() -> None:
    threading.Thread(target=spawn_forever, daemon=True).start()
    serve_empty(int(sys.argv[1]))


if __name__ == "__main__":
    main()
