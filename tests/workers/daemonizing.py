"""A worker whose server leaves its process tree the way daemons do: it double-forks a `setsid` grandchild that
becomes the placeholder model server on PORT (umemc.runtime.placeholder, answering as NAME), while the worker
itself stays in the foreground, as supervisord wants its programs.

    python daemonizing.py PORT NAME
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    port, name = sys.argv[1], sys.argv[2]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            argv = [sys.executable, "-m", "umemc.runtime.placeholder", "--model", name, "--bytes", "0", "--port", port]
            os.execv(sys.executable, argv)
        os._exit(0)
    os.wait()  # the intermediate child is gone: the server is reparented away from this tree
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
