"""Asking llama.cpp (umemc.dryrun) before a stack is budgeted: `check --measure`, `build`, `up` and
`calibrate --dry-run` run its dry run for every llama.cpp model whose file is here and record the answers in the
stack's lock (`<stack>.calibration.json`), where later checks find them without running anything."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..budget import Plan
    from ..lockfile import LockEntry
    from ..stack.resolve import LoadedStack, ResolvedModel


class Measure(Enum):
    READ = "read"  # use what the lock recorded (`check`)
    MISSING = "missing"  # ask where nothing valid is recorded (`build`, `up`)
    FRESH = "fresh"  # ask again for every model (`check --measure`, `calibrate --dry-run`)


@dataclass
class Asked:
    entries: dict[str, LockEntry]
    asked: list[str] = field(default_factory=list)  # models llama.cpp answered for, this time
    not_asked: list[str] = field(default_factory=list)  # one line each: no llama.cpp found for the model
    failed: list[str] = field(default_factory=list)  # one line each: llama.cpp could not size the file


def ask_llama_cpp(loaded: LoadedStack, plan: Plan, measure: Measure, only: list[str] | None = None) -> Asked:
    """Run the dry run where `measure` says; returns the stack's lock entries with the new answers."""
    from .. import lockfile
    from ..catalog.runtimes import LLAMA_RUNTIMES
    from ..compile import compile_bundle
    from ..dryrun import find_tool, run
    from ..errors import RuntimeFailure
    from ..estimate.gguf_file import locked_header
    from ..estimate.gguf_file import read as read_gguf
    from ..estimate.llama import dry_run_flags
    from ..launchers import dry_run_args

    out = Asked(dict(loaded.calibration))
    if measure is Measure.READ or plan.nodes:  # several nodes: each asks its own llama.cpp (`--node`)
        return out
    chosen = [
        m
        for m in loaded.models.values()
        if m.spec.runtime in LLAMA_RUNTIMES and m.model_present and (not only or m.name in only)
    ]
    if not chosen:
        return out
    bundle = compile_bundle(plan)
    for m in chosen:
        tool = find_tool(m.spec.runtime, m.spec.bin)
        if isinstance(tool, str):
            out.not_asked.append(f"{m.name}: llama.cpp not asked: {tool}")
            continue
        flags, entry = dry_run_flags(loaded, m), out.entries.get(m.name)
        if measure is Measure.MISSING and _still_valid(entry, m, tool.identity, flags):
            continue
        args = dry_run_args(plan.models[m.name], list(bundle.programs[m.name].argv))
        assert args is not None and m.model_path is not None
        try:
            answer = run(tool, args, flags)
        except RuntimeFailure as exc:
            out.failed.append(f"{m.name}: llama.cpp could not size its file: {exc}")
            continue
        base = entry or lockfile.LockEntry()
        out.entries[m.name] = base.model_copy(
            update={
                "file": lockfile.identity(m.model_path),
                "header": locked_header(read_gguf(m.model_path)),
                "dry_run": answer,
            }
        )
        out.asked.append(m.name)
    return out


def _still_valid(entry: LockEntry | None, m: ResolvedModel, identity: object, flags: dict[str, object]) -> bool:
    from ..lockfile import identity as file_identity

    if entry is None or entry.dry_run is None or m.model_path is None:
        return False
    run = entry.dry_run
    return run.identity == identity and run.flags == flags and entry.file == file_identity(m.model_path)


def record(stack: Path, asked: Asked) -> str | None:
    """Write the lock; None, or why it could not be written (the answers still serve this command)."""
    from .. import lockfile

    if not asked.asked:
        return None
    try:
        lockfile.save(stack, asked.entries)
    except OSError as exc:
        return f"cannot record llama.cpp's answers in {lockfile.path_for(stack)}: {exc.strerror}"
    return None


def report(asked: Asked, plan: Plan, loud: bool) -> None:
    """One line per model to stderr: what llama.cpp answered, where it failed, and (loud: the user asked for
    a dry run) where no llama.cpp was found."""
    for name in asked.asked:
        run = asked.entries[name].dry_run
        assert run is not None
        est = plan.models[name].estimate
        print(
            f"llama.cpp sized {name} ({run.tool} {run.build}, {run.seconds:.2f} s): weights "
            f"{_gib(est.weights.bytes)}, KV {_gib(est.kv.bytes)}, compute {_gib(est.compute.bytes)}",
            file=sys.stderr,
        )
    for line in asked.failed + (asked.not_asked if loud else []):
        print(f"warning: {line}", file=sys.stderr)


def _gib(n: int) -> str:
    from ..units import human

    return human(n)
