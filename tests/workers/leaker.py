"""A leaking test worker: grows its resident memory at RATE MiB/s in STEP-MiB steps up to CAP MiB,
logging its own resident size after every step (the test reads the last line it wrote before it
was killed: that is the overshoot it reached).

    python leaker.py RATE_MIB_S [STEP_MIB] [CAP_MIB] [START]

START: a delay in seconds, or the path of a file whose creation starts the growth (a test's go signal).
"""

from __future__ import annotations

import os
import sys
import time

from umemc.runtime.memory import Held

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def anon() -> int:
    """RssAnon: the private memory charged to the worker's own cgroup (shared library pages in
    RSS are charged to whichever cgroup touched them first)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    rate = float(sys.argv[1]) * 2**20
    step = int(float(sys.argv[2]) * 2**20) if len(sys.argv) > 2 else 2 * 2**20
    cap = int(float(sys.argv[3]) * 2**20) if len(sys.argv) > 3 else 3 * 2**30
    start_at = sys.argv[4] if len(sys.argv) > 4 else "0"
    try:
        time.sleep(float(start_at))
    except ValueError:
        while not os.path.exists(start_at):
            time.sleep(0.05)
    held, start = Held(), time.monotonic()
    out = os.fdopen(1, "w", buffering=1)
    print(f"start pid={os.getpid()} rss={rss()}", file=out)
    while held.bytes < cap:
        held.grow(step)
        print(f"rss {rss()} anon {anon()} t={time.monotonic() - start:.4f} wall={time.time():.4f}", file=out)
        ahead = held.bytes / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    print("cap reached", file=out)
    time.sleep(3600)


if __name__ == "__main__":
    main()
