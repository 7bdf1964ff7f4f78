"""A worker that escapes its process group the way daemons do: it double-forks a `setsid`
grandchild that sleeps (holding HOLD_MIB of touched memory, default 0), writes the grandchild's pid
to PIDFILE, then serves HTTP on PORT.

    python forker.py PORT PIDFILE [HOLD_MIB]
"""

from __future__ import annotations

import os
import sys
import time

from _serve import serve_empty  # beside this script


def main() -> None:
    port, pidfile = int(sys.argv[1]), sys.argv[2]
    hold_mib = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            held = bytearray(hold_mib * 1024 * 1024)
            for i in range(0, len(held), 4096):  # touch every page: resident, not just reserved
                held[i] = 1
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
