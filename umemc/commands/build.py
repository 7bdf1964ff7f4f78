"""`umemc build STACK [-o DIR]`: write the bundle (default build/<name>/) and print the budget.
Exit 0 when the hot set fits, 1 when the bundle was written but does not fit, 2 invalid."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from .args import Args
from .common import console, plan_from_arg

if TYPE_CHECKING:
    from ..budget.plan import Plan


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("build", help="compile a stack into a bundle: supervisord config, env, sysctl, kernel knobs")
    p.add_argument("stack", help="the stack file (TOML)")
    p.add_argument("-o", "--output", metavar="DIR", help="bundle directory (default: build/<name>/)")
    p.add_argument(
        "--target",
        choices=("bundle", "kubernetes"),
        default="bundle",
        help="bundle: supervisord bundles (one per node with [nodes]); kubernetes: manifests in DIR/kubernetes/",
    )
    p.add_argument(
        "--files-later",
        action="store_true",
        help="model files named in the stack arrive before `umemc up` (build without them)",
    )
    add_no_measure(p)
    p.set_defaults(func=run)


def add_no_measure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-measure",
        action="store_true",
        help="do not ask llama.cpp's dry run for models it has not sized yet (the default where llama.cpp is here)",
    )


def build(plan: Plan, out: Path, *, simulate: bool = False, files_later: bool | None = None) -> list[str]:
    """Compile, render and write atomically; returns the relative paths written. files_later (`umemc
    build`): refuse model files the runtime needs and the stack lacks, after what cannot be compiled."""
    from ..compile.bundle import compile_bundle
    from ..targets.files import render_bundle
    from ..write import write_bundle

    check_bundle_dir(out)
    if plan.nodes:
        files = node_bundles(plan)
    else:
        files = render_bundle(compile_bundle(plan, simulate=simulate))
    refuse_missing_files(plan, files_later)
    write_bundle(out, files)
    return list(files)


def refuse_missing_files(plan: Plan, files_later: bool | None) -> None:
    """No model key is always refused; a named file that is not there yet only without --files-later.
    None: not asked (`umemc up` builds too, and its preflight says what is missing)."""
    from ..budget.plan import missing_files

    if files_later is None:
        return
    for no_key, message in missing_files(plan):
        if no_key or not files_later:
            raise UsageError(message)


def build_kubernetes(plan: Plan, out: Path, files_later: bool | None = None) -> list[str]:
    """The manifests, made first and then written (writer threads beside the renderer only fought it for the
    interpreter: slower than one after the other)."""
    from ..targets.kubernetes import not_scaled, render
    from ..targets.report import budget_json, budget_markdown
    from ..write import write_bundle

    check_bundle_dir(out)
    refuse_missing_files(plan, files_later)
    files = render(plan)
    for warning in not_scaled(plan):
        print(f"warning: {warning}", file=sys.stderr)
    files |= {"budget.json": budget_json(plan), "budget.md": budget_markdown(plan)}
    return write_bundle(out, files)


def node_bundles(plan: Plan) -> dict[str, str]:
    """A stack with [nodes]: one complete bundle per node under nodes/NAME/ (each runnable with
    `umemc up DIR/nodes/NAME` on that machine), and the whole stack's budget and placement on top."""
    from ..compile.bundle import compile_bundle
    from ..targets.files import render_bundle
    from ..targets.report import budget_json, budget_markdown
    from ..write import MARKER, MARKER_TEXT

    files = {"budget.json": budget_json(plan), "budget.md": budget_markdown(plan)}
    for name, node in plan.nodes.items():
        files |= {f"nodes/{name}/{rel}": text for rel, text in render_bundle(compile_bundle(node)).items()}
        files[f"nodes/{name}/{MARKER}"] = MARKER_TEXT
    return dict(sorted(files.items()))


def check_bundle_dir(out: Path) -> None:
    """supervisord.conf names its own directory as "%(here)s" inside double quotes (the bundle can move):
    a directory whose path holds a quote, a backslash or a control character cannot be carried."""
    from ..chars import CONTROL

    path = str(out.absolute())
    if '"' in path or "\\" in path or CONTROL.search(path):
        raise UsageError(
            f"cannot write a bundle to {path!r}: supervisord.conf cannot name a directory whose "
            "path holds a double quote, a backslash or a control character; choose another -o"
        )


@dataclass(frozen=True)
class BuildArgs(Args):
    stack: str
    output: str | None
    target: str
    files_later: bool
    no_measure: bool


def run(ns: argparse.Namespace) -> int:
    args = BuildArgs.of(ns)
    from ..targets.table import print_budget
    from .asking import Measure

    plan = plan_from_arg(args.stack, Measure.READ if args.no_measure else Measure.MISSING)
    out = Path(args.output) if args.output else Path("build") / plan.name
    if args.target == "kubernetes":  # the files are read on the nodes (their volume), not here: --files-later
        written = build_kubernetes(plan, out, files_later=True)
    else:
        written = build(plan, out, files_later=args.files_later)
    out_console = console()
    print_budget(plan, out_console)
    out_console.print(f"\nwrote {out}/ ({len(written)} files):\n" + "\n".join(f"  {x}" for x in listing(written)))
    return 0 if plan.fits else 1


LISTED = 40  # a bundle of more files is listed by directory


def listing(files: list[str]) -> list[str]:
    """The files written, each; or, for many, each directory with how many files it holds."""
    if len(files) <= LISTED:
        return files
    counts: dict[str, int] = {}
    for rel in files:
        parts = rel.split("/")[:-1][:2]  # kubernetes/models/, kubernetes/node-prep/: not each node's folders
        folder = "/".join(parts) + "/" if parts else ""
        counts[folder] = counts.get(folder, 0) + 1
    return [f"{folder or './'} ({n} file{'s' if n > 1 else ''})" for folder, n in counts.items()]
