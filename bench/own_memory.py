"""umemc's own processes beside a running stack: resident memory (RSS), and its proportional share (PSS: a page
several processes map counted once, split among them) and what is the process's alone (USS), of supervisord, the
enforcer, its standby and the gateway, after the gateway has relayed some requests; then the CPU each uses while the
stack stands idle (what an idle box pays for umemc).

    python bench/own_memory.py [--requests 400] [--samples 5] [--idle-s 30]

The stack is bench/gateway.py's (`umemc up --simulate`: command workers, a gateway); each memory figure is the
median of `--samples` reads a second apart; the idle CPU is user + system over `--idle-s` seconds with no request,
in milliseconds a second. Goal: the processes' RSS together <= 100 MiB.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from bench.common import cpu_seconds, write_section
from bench.gateway import load, running
from tests.runtime.conftest import OWN, own_pids

PY = sys.executable
MiB = 1024 * 1024


def sample(pids: dict[str, int]) -> dict[str, tuple[float, float, float]]:
    out = {}
    for name, pid in pids.items():
        m = psutil.Process(pid).memory_full_info()
        out[name] = (m.rss / MiB, m.pss / MiB, m.uss / MiB)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--idle-s", type=float, default=30.0)
    args = ap.parse_args()
    with running() as (ports, run):
        load(ports["gateway"], args.requests, 8)
        pids = own_pids(run)
        samples = []
        for _ in range(args.samples):
            time.sleep(1.0)
            samples.append(sample(pids))
        procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        before = {name: cpu_seconds(p) for name, p in procs.items()}
        time.sleep(args.idle_s)
        idle = {name: (cpu_seconds(p) - before[name]) / args.idle_s * 1000 for name, p in procs.items()}
    rows, totals = [], [0.0, 0.0, 0.0, 0.0]
    for name in (n for n in OWN if n in pids):  # with a gateway, the standby enforcer is a thread of its process
        figures = [*(statistics.median(s[name][i] for s in samples) for i in range(3)), idle[name]]
        totals = [t + f for t, f in zip(totals, figures, strict=True)]
        rows.append(f"| {name} | {figures[0]:.1f} | {figures[1]:.1f} | {figures[2]:.1f} | {figures[3]:.1f} |")
    lines = [
        f"Python {sys.version.split()[0]}; `umemc up --simulate` of bench/gateway.py's stack, {args.requests} requests"
        f" relayed by the gateway first; MiB, medians of {args.samples} reads a second apart; then the CPU of each"
        f" over {args.idle_s:g} s with no request (user + system, ms a second).",
        "",
        "| process | RSS | PSS | USS | idle CPU ms/s |",
        "|---|---:|---:|---:|---:|",
        *rows,
        f"| **together** | **{totals[0]:.1f}** | **{totals[1]:.1f}** | **{totals[2]:.1f}** | **{totals[3]:.1f}** |",
        "",
        "Goal: RSS together <= 100 MiB.",
    ]
    text = "\n".join(lines)
    print(text)
    write_section("umemc's own processes beside a stack (bench/own_memory.py)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
