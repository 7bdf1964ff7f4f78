"""`umemc logs MODEL [-n N] [-f] [--run-dir DIR]`: a worker's output as supervisord captured it
(RUN/state/logs/MODEL.out.log and MODEL.err.log), or umemc's own programs' (umemc-enforcer,
umemc-gateway, supervisord), or the gateway's access log (access: a JSON line per request). `-f` keeps
printing new lines, across log rotation, until interrupted."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from .args import Args
from .up import add_run_dir, no_stack_in


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("logs", help="a worker's output (stdout and stderr as supervisord captured them)")
    p.add_argument("model", help="a model of the running stack, or umemc-enforcer, umemc-gateway, supervisord, access")
    add_run_dir(p, "option")
    p.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="print the last N lines (default 50)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until interrupted")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class LogsArgs(Args):
    name_hint: str
    model: str
    run_dir: str
    lines: int
    follow: bool


def run(ns: argparse.Namespace) -> int:
    args = LogsArgs.of(ns)
    from ..runtime.rundir import RunDir

    run_dir = RunDir(Path(args.run_dir).absolute())
    if not run_dir.state.exists():
        raise no_stack_in(args.run_dir, args.name_hint)
    files = run_dir.log_files(args.model)
    if not any(f.exists() for f in files):
        known = sorted({p.name.split(".")[0] for p in run_dir.logs.glob("*.log")} | {"supervisord"})
        raise UsageError(f"no logs for {args.model!r} in {args.run_dir}; logs exist for: {', '.join(known)}")
    if args.lines < 0:
        raise UsageError("-n must be 0 or more")
    label = len(files) > 1
    offsets: dict[Path, tuple[int, int]] = {}  # file -> (inode, bytes read)
    for f in files:
        if not f.exists():
            continue
        data = f.read_bytes()
        tail = data.splitlines()[-args.lines :] if args.lines else []
        _print(f, tail, label=label)
        offsets[f] = (f.stat().st_ino, len(data))
    if not args.follow:
        return 0
    try:
        while True:
            time.sleep(0.2)
            for f in files:
                _follow(f, offsets, label=label)
    except KeyboardInterrupt:
        return 0


def _follow(f: Path, offsets: dict[Path, tuple[int, int]], *, label: bool) -> None:
    try:
        st = f.stat()
    except FileNotFoundError:
        return
    inode, pos = offsets.get(f, (st.st_ino, 0))
    if st.st_ino != inode or st.st_size < pos:  # rotated or truncated: start the new file from its top
        pos = 0
    if st.st_size == pos:
        offsets[f] = (st.st_ino, pos)
        return
    with f.open("rb") as fh:
        fh.seek(pos)
        chunk = fh.read()
    end = chunk.rfind(b"\n") + 1  # print whole lines only; the rest waits for its newline
    _print(f, chunk[:end].splitlines(), label=label)
    offsets[f] = (st.st_ino, pos + end)


def _print(f: Path, lines: list[bytes], *, label: bool) -> None:
    prefix = f"{f.name.split('.')[-2]}| " if label else ""
    for line in lines:
        sys.stdout.write(prefix + line.decode("utf-8", "replace") + "\n")
    sys.stdout.flush()
