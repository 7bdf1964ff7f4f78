"""Helpers the subcommands share: loading a stack from an argument, printing to stdout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..budget.plan import Plan, make_plan
from ..stack.resolve import load_stack
from .asking import Measure

if TYPE_CHECKING:
    from rich.console import Console

    from ..hub.ref import HfRef
    from ..lockfile import LockEntry


def plan_from_arg(stack_arg: str, measure: Measure = Measure.READ, only: list[str] | None = None) -> Plan:
    """Load, estimate and budget the stack named on the command line (errors carry its spelling); a
    stack that does not fit gets its advice. `measure`: whether llama.cpp's dry run is asked first (and
    recorded in the stack's lock) where llama.cpp is on this machine."""
    from ..budget.advice import advise

    path = Path(stack_arg)
    loaded = load_stack(path, shown=stack_arg, hub=hub_header)
    plan = make_plan(loaded)
    if measure is not Measure.READ:
        from .asking import ask_llama_cpp, record, report

        asked = ask_llama_cpp(loaded, plan, measure, only)
        problem = record(path, asked, list(loaded.fetched))
        if asked.asked:
            loaded = load_stack(path, shown=stack_arg, locks=asked.entries)
            plan = make_plan(loaded)
        report(asked, plan, loud=measure is Measure.FRESH)
        if problem:
            print(f"warning: {problem}", file=sys.stderr)
    return advise(loaded, plan)


def hub_header(ref: HfRef) -> LockEntry:
    """A Hub model not on disk, sized from its header on the Hub (umemc.hub.remote: a few MB read)."""
    from ..estimate.hub_header import lock_entry

    return lock_entry(ref)


def console() -> Console:
    """stdout for rich output. Off a terminal (a CI log, a pipe, pre-commit) nothing is wrapped or
    cut at 80 columns: text lines stay whole and tables get 200 columns."""
    from rich.console import Console

    from ..targets.table import WIDTH

    tty = Console(highlight=False)
    return tty if tty.is_terminal else Console(highlight=False, width=WIDTH, soft_wrap=True)


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def print_warnings(plan: Plan) -> None:
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for a in plan.advice:
        print(a, file=sys.stderr)
