"""The enforcer: a program inside the same supervisord (restarted if it dies), reading plan.json.

Every sample_interval it reads each worker's whole process tree (kept-open statm, task children)
and its GPU-side memory (DRM fdinfo; nvidia-smi now and then), and
- soft quota crossed: event `soft_limit`, once per crossing (re-armed below 95% of it);
- hard quota crossed: SIGKILL the worker's process group at once, event `hard_limit_kill`
  (by enforcer); supervisord restarts it; after max_kills within kill_window it is left stopped;
- a kernel OOM kill in the worker's cgroup: event `hard_limit_kill` (by kernel);
- usage climbing faster than leak_threshold per minute over leak_window: `leak_suspected`;
- system pressure above evict_above: stop workers, lowest priority first, then least recently
  active, until pressure is below load_below (`evict`); the victim with requests in flight at the
  gateway is waited for (`evict_deferred`), never cut off, and no higher priority taken instead.
A worker near its hard quota is sampled every FAST_S in between, so a fast leak is caught early.

Its parts: `sampler` (what a worker holds, the machine's pressure), `rules` (the quota rules, pure),
`worker` (each worker's quota, measurements and phase: one state machine), `pressure` (the guard),
`status` (enforcer.json), `loop` (the loop that runs them).

    python -m umemc.runtime.enforcer --bundle BUNDLE_DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .loop import Enforcer

__all__ = ["Enforcer", "main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="umemc-enforcer")
    p.add_argument("--bundle", required=True)
    args = p.parse_args(argv)
    Enforcer(Path(args.bundle).resolve()).run()
    return 0
