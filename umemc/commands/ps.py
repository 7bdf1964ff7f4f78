"""`umemc ps [--json]`: the stacks this user runs, from any directory: each one's name, whether it runs, its
models (hot and cold; a node of a stack of several: the other nodes' models too, `elsewhere`, which its gateway
answers for) and its gateway, and the run dir it runs from. `status STACK`, `down STACK`, `events STACK`,
`logs MODEL --stack STACK` and `chat MODEL --stack STACK` take the names it shows. Exit 0."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .args import Args


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("ps", help="list the stacks this user runs, from any directory")
    p.add_argument("--json", action="store_true", help="a JSON array, one object per stack")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class PsArgs(Args):
    json: bool


def run(ns: argparse.Namespace) -> int:
    args = PsArgs.of(ns)
    from ..chars import shown
    from ..runtime.registry import known

    records, unreadable = known()
    rows = [_row(r.as_json()) for r in records]
    for line in unreadable:
        print(f"warning: {shown(line)}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no stack runs (`umemc up STACK` starts one)")
        return 0
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from .common import console

    t = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    for col in ("stack", "state", "models", "gateway", "run dir"):
        t.add_column(col, no_wrap=col != "models", min_width=len(col))
    for row in rows:
        models = ", ".join(f"{n} ({mode})" for n, mode in row["models"].items())
        if row.get("elsewhere"):  # a node of a stack of several: its gateway answers for these too
            models += "; on other nodes: " + ", ".join(f"{n} ({node})" for n, node in row["elsewhere"].items())
        cells = (row["name"], row["state"], models or "-", row["gateway"] or "-", row["run_dir"])
        t.add_row(*(escape(shown(c)) for c in cells))  # what a record on disk says, never raw to the terminal
    console().print(t)
    return 0


def _row(record: dict[str, Any]) -> dict[str, Any]:
    """The record with what the run dir says now: running, stopped (supervisord gone: `down` was not run) or gone
    (no run dir), and its models with their modes."""
    from ..contract import ContractError, PlanDoc, read
    from ..errors import RuntimeFailure
    from ..runtime.control import Stack
    from ..runtime.rundir import RunDir

    run_dir = RunDir(Path(record["run_dir"]))
    if not run_dir.bundle.is_dir():
        return {**record, "state": "gone", "models": {}}
    elsewhere: dict[str, str] = {}
    try:
        plan = read(PlanDoc, run_dir.plan)
        models = {n: m.mode for n, m in plan.models.items() if m.part_of is None}
        elsewhere = {n: p.node for n, p in plan.peers.items()}  # a node of several: the others' models, by node
    except (ContractError, OSError):
        models = {}
    try:
        state = "running" if Stack(run_dir).state() == "running" else "stopped"
    except RuntimeFailure:  # supervisord alive but deaf: say so, list the rest
        state = "not answering"
    return {**record, "state": state, "models": models} | ({"elsewhere": elsewhere} if elsewhere else {})
