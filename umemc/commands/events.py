"""`umemc events [--run-dir DIR] [--json] [--follow]`: the event log (start, exit, soft_limit,
hard_limit_kill, evict, leak_suspected, give_up, ...). `--json` prints a JSON array; with
`--follow`, one JSON object per line as events arrive."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from .args import Args
from .up import add_run_dir

if TYPE_CHECKING:
    from ..runtime.event_log import Event
    from ..runtime.rundir import RunDir


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("events", help="what the runtime did: starts, exits, quota breaches, kills, evictions")
    add_run_dir(p, "positional")
    p.add_argument("--json", action="store_true", help="a JSON array (JSON lines with --follow)")
    p.add_argument("--follow", action="store_true", help="keep printing new events until interrupted")
    p.add_argument("--model", action="append", metavar="NAME", help="only this model's events (repeatable)")
    p.add_argument("--kind", action="append", metavar="KIND", help="only events of this kind (repeatable)")
    p.add_argument(
        "--since",
        metavar="WHEN",
        help='only events after WHEN: a duration ago ("10m", "2h", "30s") or an ISO-8601 time',
    )
    p.set_defaults(func=run)


def since_ts(text: str, now: float) -> float:
    """'10m' -> now - 600; '2026-12-01T05:00:00+00:00' -> that instant (UTC when no zone is given)."""
    from datetime import UTC, datetime

    from ..units import parse_duration

    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f'--since {text!r}: not a duration ("10m", "2h") or an ISO-8601 time ("2026-12-01T05:00:00")'
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def wanted(args: EventsArgs, after: float | None) -> Callable[[Event], bool]:
    models, kinds = set(args.model or ()), set(args.kind or ())
    return lambda e: (
        (not models or e.model in models) and (not kinds or e.kind in kinds) and (after is None or e.ts > after)
    )


def _check_filters(args: EventsArgs, run_dir: RunDir) -> None:
    """A filter that can never match is a typo: say so (exit 2) rather than print nothing."""
    import difflib

    from ..runtime.event_log import KINDS

    for kind in args.kind or ():
        if kind not in KINDS:
            close = difflib.get_close_matches(kind, KINDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (kinds: {', '.join(KINDS)})"
            raise UsageError(f"--kind {kind!r}: no such event kind{hint}")
    models = _plan_models(run_dir)
    for name in args.model or ():
        if models is not None and name not in models:
            close = difflib.get_close_matches(name, models, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (models: {', '.join(models)})"
            raise UsageError(f"--model {name!r}: not a model of this stack{hint}")


def _plan_models(run_dir: RunDir) -> list[str] | None:
    """The stack's model names from the run's plan; None when the plan cannot be read (filter as asked)."""
    try:
        from ..records import read_text

        doc = json.loads(read_text(run_dir.plan))
        return list(doc["models"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def _line(e: Event) -> str:
    doc = e.as_json()
    detail = " ".join(f"{k}={v}" for k, v in doc["detail"].items())
    return f"{doc['time']}  {doc['model'] or '-':16} {doc['kind']:16} {detail}"


@dataclass(frozen=True)
class EventsArgs(Args):
    run_dir: str
    json: bool
    follow: bool
    model: list[str] | None
    kind: list[str] | None
    since: str | None


def run(ns: argparse.Namespace) -> int:
    args = EventsArgs.of(ns)
    from ..runtime.event_log import EventLog
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
    _check_filters(args, run_dir)
    keep = wanted(args, None if args.since is None else since_ts(args.since, time.time()))
    read = log.since(0)
    last = read[-1].id if read else 0
    events = [e for e in read if keep(e)]
    if args.json and not args.follow:
        print(json.dumps([e.as_json() for e in events], indent=2))
        return 0
    try:
        while True:
            for e in events:
                print(json.dumps(e.as_json()) if args.json else _line(e), flush=True)
            if not args.follow:
                return 0
            time.sleep(0.2)
            fresh = log.since(last)
            last = fresh[-1].id if fresh else last
            events = [e for e in fresh if keep(e)]
    except KeyboardInterrupt:
        return 0
    finally:
        log.close()
