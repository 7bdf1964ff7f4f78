"""`umemc check STACK… [--format table|json|markdown]`: validate and budget, write nothing.
Exit 0 when every hot set fits, 1 when one does not, 2 for an invalid stack (checked first)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from ..budget.plan import Plan
from ..compile.bundle import compile_bundle
from ..errors import StackError
from .args import Args
from .asking import Measure
from .build import refuse_missing_files
from .common import console, plan_from_arg, print_warnings, write_stdout


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("check", help="validate a stack and print its memory budget (writes nothing)")
    p.add_argument("stack", nargs="+", help="the stack file (TOML); several are checked in turn (pre-commit)")
    p.add_argument(
        "--format",
        choices=("table", "json", "markdown"),
        default="table",
        help="table (default), json (the budget.json contract, alone on stdout) or markdown "
        "(for a pull-request comment)",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="ask llama.cpp itself (its no_alloc dry run, no weight read) for every llama.cpp model whose file is "
        "here, and record the answers in STACK.calibration.json (without it, check uses what was recorded)",
    )
    p.set_defaults(func=run)


@dataclass(frozen=True)
class CheckArgs(Args):
    stack: list[str]
    format: str
    measure: bool


def run(ns: argparse.Namespace) -> int:
    """Every stack is checked; an invalid one is reported (stderr) and does not hide the others.
    Exit code: the worst of them (2 invalid, 1 does not fit, 0 fits)."""
    args = CheckArgs.of(ns)
    valid: list[tuple[str, Plan]] = []
    invalid = 0
    for arg in args.stack:
        try:
            plan = plan_from_arg(arg, Measure.FRESH if args.measure else Measure.READ)
            for one in plan.nodes.values() or [plan]:  # what `build` would refuse, `check` refuses too
                compile_bundle(one)
            refuse_missing_files(plan, files_later=True)  # a named file may come later; no model key never
        except StackError as exc:
            if len(args.stack) == 1:
                raise
            print(exc, file=sys.stderr)
            invalid += 1
            continue
        valid.append((arg, plan))
    stacks, plans = [a for a, _ in valid], [p for _, p in valid]
    if args.format == "json":
        from ..targets.report import budget_dict, budget_json

        if len(args.stack) == 1:
            write_stdout(budget_json(plans[0]))
        else:
            write_stdout(json.dumps({s: budget_dict(p) for s, p in zip(stacks, plans, strict=True)}, indent=2) + "\n")
        for plan in plans:
            print_warnings(plan)
    else:
        for plan in plans:
            _print(plan, args.format)
    if invalid:
        return 2
    return 0 if all(p.fits for p in plans) else 1


def _print(plan: Plan, fmt: str) -> None:
    if fmt == "markdown":
        from ..targets.report import budget_markdown

        write_stdout(budget_markdown(plan))
    else:
        from ..targets.table import plain_budget, print_budget

        text = plain_budget(plan)  # off a terminal: rich's bytes without importing rich
        if text is not None:
            write_stdout(text)
        else:
            print_budget(plan, console())
