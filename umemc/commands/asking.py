"""Asking llama.cpp (umemc.estimate.dryrun) before a stack is budgeted: `check --measure`, `build`, `up` and
`calibrate --dry-run` run its dry run for every llama.cpp model whose file is here and record the answers in the
stack's lock (`<stack>.calibration.json`), where later checks find them without running anything."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..budget.plan import Plan
    from ..lockfile import LockEntry
    from ..stack.resolved import LoadedStack, ResolvedModel


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
    from msgspec.structs import replace

    from .. import lockfile
    from ..catalog.runtimes import LLAMA_RUNTIMES
    from ..compile.launchers import dry_run_args
    from ..errors import RuntimeFailure
    from ..estimate import keys
    from ..estimate.dryrun import bound, find_tool, run
    from ..estimate.gguf_file import locked_header
    from ..estimate.gguf_file import read as read_gguf

    out = Asked(dict(loaded.calibration))
    if measure is Measure.READ:
        return out
    if plan.nodes:  # several nodes: a split model's main node asks with its helpers up, the others use the hand model
        return _ask_splits(loaded, plan, measure, out, only)
    chosen = [
        m
        for m in loaded.models.values()
        if m.spec.runtime in LLAMA_RUNTIMES
        and (m.model_present or _hub_copy(m, out.entries.get(m.name)) is not None)
        and (not only or m.name in only)
    ]
    if not chosen:
        return out
    for m in chosen:
        tool = find_tool(m.spec.runtime, m.spec.bin)
        if isinstance(tool, str):
            out.not_asked.append(f"{m.name}: llama.cpp not asked: {tool}")
            continue
        flags, entry = keys.dry_run(loaded, m), out.entries.get(m.name)
        # a Hub model not downloaded yet is asked on the sparse copy of its header (llama.cpp reads no weight)
        file = m.model_path if m.model_present else _hub_copy(m, entry)
        assert file is not None and m.model_path is not None
        if measure is Measure.MISSING and _still_valid(entry, file, tool.identity, flags):
            continue
        args = dry_run_args(plan.models[m.name], launch_argv(plan, m.name))
        assert args is not None
        args = [str(file) if a == str(m.model_path) else a for a in args]
        facts = read_gguf(file)
        try:  # the run reads the header and no weight: bounded by the header's size
            answer = run(tool, args, flags, bound(max(0, file.stat().st_size - facts.tensor_bytes)))
        except RuntimeFailure as exc:
            out.failed.append(f"{m.name}: llama.cpp could not size its file: {exc}")
            continue
        base = entry or lockfile.LockEntry()
        out.entries[m.name] = replace(base, file=lockfile.identity(file), header=locked_header(facts), dry_run=answer)
        out.asked.append(m.name)
    return out


def _ask_splits(loaded: LoadedStack, plan: Plan, measure: Measure, out: Asked, only: list[str] | None) -> Asked:
    """A model split across nodes, asked with the RPC servers of its helpers up and idle: llama.cpp's dry run on
    the main node's argv (--rpc and the split), whose compute buffer per device sizes each part (the hand model's
    figure is an upper bound for a helper). Recorded as the lock entry's split_dry_run; asked only where every
    helper answers (an RPC server serves one client: a running model's helpers are busy)."""
    from msgspec.structs import replace

    from .. import lockfile
    from ..compile.launchers import dry_run_args
    from ..document import values
    from ..errors import RuntimeFailure
    from ..estimate import keys
    from ..estimate.dryrun import bound, find_tool, run
    from ..estimate.gguf_file import read as read_gguf
    from ..runtime.wrap import silent

    for name, whole in plan.models.items():
        split = whole.split
        if split is None or (only and name not in only):
            continue
        endpoints = [p.endpoint for p in split.helpers if p.endpoint is not None]
        rm = plan.nodes[split.main].models[name].model
        assert rm.model_path is not None
        flags = keys.dry_run(loaded, rm) | {
            "rpc": ",".join(endpoints),
            "file": values(lockfile.identity(rm.model_path)),
        }
        entry = out.entries.get(name)
        if measure is Measure.MISSING and entry is not None and entry.split_dry_run is not None:
            if entry.split_dry_run.flags == flags:
                continue
        if silent(endpoints, HELPERS_WAIT_S):
            out.not_asked.append(
                f"{name}: llama.cpp not asked for its split: the RPC servers of its other nodes do not answer "
                f"({', '.join(endpoints)}); `umemc up` those nodes first"
            )
            continue
        tool = find_tool("llama-server", rm.spec.bin)
        if isinstance(tool, str):
            out.not_asked.append(f"{name}: llama.cpp not asked for its split: {tool}")
            continue
        main = plan.nodes[split.main]
        args = dry_run_args(main.models[name], launch_argv(main, name))
        assert args is not None
        facts = read_gguf(rm.model_path)
        try:
            answer = run(tool, args, flags, bound(max(0, rm.model_path.stat().st_size - facts.tensor_bytes)))
        except RuntimeFailure as exc:
            out.failed.append(f"{name}: llama.cpp could not size its split: {exc}")
            continue
        now = lockfile.identity(rm.model_path)
        # an entry of another file is stale whole (its other records too): this file's starts afresh
        base = entry if entry is not None and entry.file == now else lockfile.LockEntry(file=now)
        out.entries[name] = replace(base, split_dry_run=answer)
        out.asked.append(name)
    return out


HELPERS_WAIT_S = 0.2  # an RPC server that accepts no connection by then is not up


def launch_argv(plan: Plan, name: str) -> list[str]:
    """The model's argv as its launcher spells it for the runtime installed here (what its bundle's program runs),
    without compiling the rest of the bundle."""
    import sys

    from ..compile.launchers import Context, argv_for

    return argv_for(plan.models[name], Context(plan, sys.executable))


def _hub_copy(m: ResolvedModel, entry: LockEntry | None) -> Path | None:
    """The sparse copy of a Hub model's header that the lock's entry was read from, if it is still cached."""
    if m.model_present or m.spec.hf is None or entry is None or entry.hub is None:
        return None
    from ..hub.ref import parse
    from ..hub.remote import header_copy_path

    path = header_copy_path(parse(m.spec.hf, m.spec.hf_revision), entry.hub.commit)
    return path if path.exists() else None


def _still_valid(entry: LockEntry | None, file: Path, identity: object, flags: dict[str, object]) -> bool:
    from ..lockfile import identity as file_identity

    if entry is None or entry.dry_run is None:
        return False
    run = entry.dry_run
    return run.identity == identity and run.flags == flags and entry.file == file_identity(file)


def record(stack: Path, asked: Asked, fetched: list[str] | None = None) -> str | None:
    """Write the lock (llama.cpp's answers, and the headers of Hub models read for this load: `fetched`);
    None, or why it could not be written (the answers still serve this command)."""
    from .. import lockfile

    if not asked.asked and not fetched:
        return None
    try:
        lockfile.save(stack, asked.entries)
    except OSError as exc:
        return f"cannot record what was learnt in {lockfile.path_for(stack)}: {exc.strerror}"
    return None


def report(asked: Asked, plan: Plan, *, loud: bool) -> None:
    """One line per model to stderr: what llama.cpp answered, where it failed, and (loud: the user asked for
    a dry run) where no llama.cpp was found."""
    from .. import lockfile

    for name in asked.asked:
        split = asked.entries[name].split_dry_run
        if plan.models[name].split is not None and split is not None:
            computes = ", ".join(f"{d} {_gib(b['compute'])}" for d, b in split.buffers.items() if "compute" in b)
            print(f"llama.cpp sized the split of {name} ({split.tool} {split.build}, {split.seconds:.2f} s) with its "
                  f"RPC servers up: compute {computes}", file=sys.stderr)  # fmt: skip
            continue
        run = asked.entries[name].dry_run
        assert run is not None
        est = plan.models[name].estimate
        # llama.cpp's own figures, whatever the estimate then uses (the weights are the header's tensors either way)
        got = lockfile.totals(run.buffers)
        kv, compute = got["kv"], got["compute"] + got["output"]
        used = "" if est.source == "llama.cpp" else f"; not used: the estimate is umemc's own ({est.source}, see why)"
        print(
            f"llama.cpp sized {name} ({run.tool} {run.build}, {run.seconds:.2f} s): weights "
            f"{_gib(est.weights.bytes)}, KV {_gib(kv)}, compute {_gib(compute)}{used}",
            file=sys.stderr,
        )
    for line in asked.failed + (asked.not_asked if loud else []):
        print(f"warning: {line}", file=sys.stderr)


def _gib(n: int) -> str:
    from ..units import human

    return human(n)
