"""`umemc check STACK [--format table|json|markdown]`: validate and budget, write nothing.
Exit 0 when the hot set fits, 1 when it does not, 2 for an invalid stack."""
from __future__ import annotations

import argparse

from .common import plan_from_arg, print_warnings, write_stdout


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("check", help="validate a stack and print its memory budget (writes nothing)")
    p.add_argument("stack", help="the stack file (TOML)")
    p.add_argument("--format", choices=("table", "json", "markdown"), default="table",
                   help="table (default), json (the budget.json contract, alone on stdout) or markdown "
                        "(for a pull-request comment)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    plan = plan_from_arg(args.stack)
    if args.format == "json":
        from ..targets.report import budget_json

        write_stdout(budget_json(plan))
        print_warnings(plan)
    elif args.format == "markdown":
        from ..targets.report import budget_markdown

        write_stdout(budget_markdown(plan))
    else:
        from ..targets.table import print_budget

        print_budget(plan)
    return 0 if plan.fits else 1
