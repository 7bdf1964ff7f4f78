"""The exec wrapper every worker starts through:

    python -m umemc.runtime.wrap --stack S --model M --hard N --soft N --cgroup auto|off --state DIR -- ARGV…

It places itself in the worker's own memory cgroup (hard quota = the kernel's limit) before anything
allocates, records the group's path in DIR/cgroups/M, then execs ARGV: the worker keeps this pid,
so supervisord, the enforcer and the kernel all see one process."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="umemc-wrap")
    p.add_argument("--stack", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--hard", type=int, required=True)
    p.add_argument("--soft", type=int, required=True)
    p.add_argument("--cgroup", choices=("auto", "off"), default="auto")
    p.add_argument("--state", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command after --")
    state = Path(args.state)
    record = state / "cgroups" / args.model
    if args.cgroup == "auto":
        place(args.stack, args.model, args.hard, args.soft, state, record)
    elif record.exists():
        record.unlink()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"umemc-wrap: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return


def place(stack: str, model: str, hard: int, soft: int, state: Path, record: Path) -> None:
    from .cgroups import detect, group_name

    backend, reason = detect(group_name(stack, state))
    record.parent.mkdir(parents=True, exist_ok=True)
    if backend is None:
        print(f"umemc-wrap: no kernel enforcement for {model}: {reason}", file=sys.stderr)
        if record.exists():
            record.unlink()
        return
    try:
        group = backend.create(model, hard, soft)
        group.enter(os.getpid())
    except OSError as exc:
        print(f"umemc-wrap: no kernel enforcement for {model}: {exc}", file=sys.stderr)
        return
    tmp = record.with_suffix(".tmp")
    tmp.write_text(f"{backend.version} {group.path} {os.getpid()}\n")
    os.replace(tmp, record)


if __name__ == "__main__":
    sys.exit(main())
