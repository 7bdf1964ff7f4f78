"""`umemc calibrate STACK [MODEL…] [--lock-only]`: start each llama.cpp-family model that has a real
file once, with exactly the compiled flags; read llama.cpp's own buffer report from its log and the
process's resident memory after a warm-up request; stop it; store the result (and the GGUF header
facts: the stack's lock) in `<stack>.calibration.json` beside the stack."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..units import human
from .args import Args

if TYPE_CHECKING:
    from ..lockfile import LockEntry


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("calibrate", help="measure llama.cpp models with their compiled flags; write the lock")
    p.add_argument("stack", help="the stack file (TOML)")
    p.add_argument("models", nargs="*", metavar="MODEL", help="only these models (default: every one with a file)")
    p.add_argument("--lock-only", action="store_true", help="record the GGUF header facts only; start nothing")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="ask llama.cpp's own dry run (no_alloc: no weight read, nothing started) instead of loading each model",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each model to load")
    p.add_argument("--node", metavar="NAME", help="a stack with [nodes]: this machine (its platform's flags)")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class CalibrateArgs(Args):
    stack: str
    models: list[str]
    lock_only: bool
    dry_run: bool
    timeout: float
    node: str | None


def run(ns: argparse.Namespace) -> int:
    args = CalibrateArgs.of(ns)
    from msgspec.structs import replace

    from .. import lockfile
    from ..budget.plan import make_plan
    from ..catalog.runtimes import LLAMA_RUNTIMES
    from ..compile.bundle import compile_bundle
    from ..estimate import keys
    from ..estimate.gguf_file import locked_header
    from ..estimate.gguf_file import read as read_gguf
    from ..runtime.measure import measure, measure_peak
    from ..stack.resolve import load_stack

    if args.dry_run:
        return _dry_run(args)
    stack_path = Path(args.stack)
    loaded = load_stack(stack_path, shown=args.stack)
    if loaded.nodes:
        if args.node not in loaded.nodes:
            raise UsageError(
                f"umemc calibrate: {args.stack} has {len(loaded.nodes)} nodes: measure on one of them and say "
                f"which with --node ({', '.join(loaded.nodes)})"
            )
        loaded = loaded.for_node(args.node)
    elif args.node is not None:
        raise UsageError(f"umemc calibrate: {args.stack} has no [nodes]: --node does not apply")
    unknown = [m for m in args.models if m not in loaded.models]
    if unknown:
        raise UsageError(f"umemc calibrate: no model {unknown[0]!r} in {args.stack}")
    chosen = [
        m
        for m in loaded.models.values()
        if (not args.models or m.name in args.models)
        and ((m.spec.runtime in LLAMA_RUNTIMES and m.model_present) or m.spec.runtime == "torch")
    ]
    if not chosen:
        raise UsageError(
            f"umemc calibrate: nothing to calibrate in {args.stack} (llama.cpp models with a present "
            "file, torch workers)"
        )
    before = make_plan(loaded)
    bundle = compile_bundle(before)
    entries = lockfile.load(stack_path)
    for m in chosen:
        if m.spec.runtime == "torch":
            if not args.lock_only:
                peak = measure_peak(bundle.programs[m.name], args.timeout)
                entries[m.name] = lockfile.LockEntry(flags=keys.torch(loaded, m), measured=peak)
                print(f"{m.name}: peak resident after its warm-up {human(peak.peak_bytes or 0)}")
            continue
        assert m.model_path is not None
        entry = lockfile.LockEntry(file=lockfile.identity(m.model_path), header=locked_header(read_gguf(m.model_path)))
        if not args.lock_only:
            entry = replace(
                entry,
                flags=keys.llama(loaded, m),
                measured=measure(bundle.programs[m.name], before.models[m.name].estimate.facts, args.timeout),
            )
        entries[m.name] = entry
        _report(m.name, before.models[m.name].estimate, entry)
    path = lockfile.save(stack_path, entries)
    print(f"wrote {path}")
    return 0


def _report(name: str, est: Any, entry: LockEntry) -> None:
    meas, h = entry.measured, entry.header
    if meas is None:
        assert h is not None
        print(f"{name}: locked {h.n_tensors} tensors, {human(h.tensor_bytes)}")
        return
    from ..lockfile import totals

    t = totals(meas.buffers)
    rows = [
        ("weights", est.weights.bytes, t["model"]),
        ("kv", est.kv.bytes, t["kv"]),
        ("compute", est.compute.bytes, t["compute"] + t["output"]),
    ]
    print(f"{name}: estimate vs llama.cpp, resident after warm-up {human(meas.rss_bytes or 0)}")
    for label, e, real in rows:
        err = (e - real) / real * 100 if real else 0.0
        print(f"  {label:8} {human(e):>12} vs {human(real):>12}  ({err:+.1f}%)")


def _dry_run(args: CalibrateArgs) -> int:
    """`calibrate --dry-run`: what `check --measure` records, with each answer set beside the hand estimate."""
    from .. import lockfile
    from ..budget.plan import make_plan
    from ..stack.resolve import load_stack
    from .asking import Measure
    from .common import plan_from_arg

    if args.node is not None:
        raise UsageError("umemc calibrate --dry-run: a stack with [nodes] is asked on each node by `umemc build`")
    plan = plan_from_arg(args.stack, Measure.FRESH, only=args.models or None)
    entries = lockfile.load(Path(args.stack))
    asked = [n for n, e in entries.items() if e.dry_run is not None and (not args.models or n in args.models)]
    if not asked:
        raise UsageError(f"umemc calibrate --dry-run: llama.cpp sized no model of {args.stack} (see the warnings)")
    hand = make_plan(load_stack(Path(args.stack), shown=args.stack, locks={}))
    for name in asked:
        est, real = hand.models[name].estimate, plan.models[name].estimate
        print(f"{name}: umemc's own estimate vs llama.cpp's dry run")
        for label, e, r in (("weights", est.weights.bytes, real.weights.bytes), ("kv", est.kv.bytes, real.kv.bytes),
                            ("compute", est.compute.bytes, real.compute.bytes)):  # fmt: skip
            err = (e - r) / r * 100 if r else 0.0
            print(f"  {label:8} {human(e):>12} vs {human(r):>12}  ({err:+.1f}%)")
    print(f"wrote {lockfile.path_for(Path(args.stack))}")
    return 0
