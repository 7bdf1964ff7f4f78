"""`umemc events [--run-dir DIR] [--json] [--follow]`: the event log (start, exit, soft_limit,
hard_limit_kill, evict, leak_suspected, give_up, ...). `--json` prints a JSON array; with
`--follow`, one JSON object per line as events arrive."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from .up import add_run_dir

if TYPE_CHECKING:
    from ..runtime.events import Event


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("events", help="what the runtime did: starts, exits, quota breaches, kills, evictions")
    add_run_dir(p)
    p.add_argument("--json", action="store_true", help="a JSON array (JSON lines with --follow)")
    p.add_argument("--follow", action="store_true", help="keep printing new events until interrupted")
    p.set_defaults(func=run)


def _line(e: Event) -> str:
    doc = e.as_json()
    detail = " ".join(f"{k}={v}" for k, v in doc["detail"].items())
    return f"{doc['time']}  {doc['model'] or '-':16} {doc['kind']:16} {detail}"


def run(args: argparse.Namespace) -> int:
    from ..runtime.events import EventLog
    from ..runtime.rundir import RunDir

    run_dir = RunDir(Path(args.run_dir).absolute())
    if not run_dir.events.exists():
        raise UsageError(f"no event log in {args.run_dir} (nothing has run there)")
    log = EventLog(run_dir.events, recover=False)
    if log.error is not None:
        raise UsageError(
            f"the event log {run_dir.events} is unusable ({log.error}); the runtime writes events to "
            "its logs in state/logs/ meanwhile"
        )
    events = log.since(0)
    if args.json and not args.follow:
        print(json.dumps([e.as_json() for e in events], indent=2))
        return 0
    last = 0
    try:
        while True:
            for e in events:
                print(json.dumps(e.as_json()) if args.json else _line(e), flush=True)
                last = e.id
            if not args.follow:
                return 0
            time.sleep(0.2)
            events = log.since(last)
    except KeyboardInterrupt:
        return 0
    finally:
        log.close()
