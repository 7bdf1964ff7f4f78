"""A worker that escapes its process group the way daemons do: it double-forks a `setsid`
grandchild that sleeps, writes the grandchild's pid to PIDFILE, then serves HTTP on PORT.

    python forker.py PORT PIDFILE
"""

from __future__ import annotations

import os
import sys
import time

from _serve import serve_empty  # beside this script


def main() -> None:
    port, pidfile = int(sys.argv[1]), sys.argv[2]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            tmp = f"{pidfile}.tmp"
            with open(tmp, "w") as f:
                f.write(str(os.getpid()))
            os.replace(tmp, pidfile)
            while True:
                time.sleep(1)
        os._exit(0)
    os.wait()

    serve_empty(port)


if __name__ == "__main__":
    main()
