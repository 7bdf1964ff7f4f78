"""`umemc explain STACK MODEL`: every figure of one model's estimate with formula and inputs."""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass

from ..errors import UsageError
from .args import Args
from .common import plan_from_arg, write_stdout


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("explain", help="show how one model's estimate is computed")
    p.add_argument("stack", help="the stack file (TOML)")
    p.add_argument("model", help="a model name from the stack")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class ExplainArgs(Args):
    stack: str
    model: str


def run(ns: argparse.Namespace) -> int:
    args = ExplainArgs.of(ns)
    from ..targets.explanation import explain_text

    plan = plan_from_arg(args.stack)
    if args.model not in plan.models:
        close = difflib.get_close_matches(args.model, list(plan.models), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (models: {', '.join(plan.models)})"
        raise UsageError(f"umemc explain: no model {args.model!r} in {args.stack}{hint}")
    write_stdout(explain_text(plan, plan.models[args.model]))
    return 0
