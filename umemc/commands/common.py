"""Helpers the subcommands share: loading a stack from an argument, printing to stdout."""

from __future__ import annotations

import sys
from pathlib import Path

from ..budget import Plan, make_plan
from ..stack.resolve import load_stack


def plan_from_arg(stack_arg: str) -> Plan:
    """Load, estimate and budget the stack named on the command line (errors carry its spelling)."""
    return make_plan(load_stack(Path(stack_arg), shown=stack_arg))


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def print_warnings(plan: Plan) -> None:
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
