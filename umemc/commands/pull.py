"""`umemc pull STACK [MODEL…] [--dry-run] [--quiet]`: download the Hub files (`hf`, `mmproj_hf`) the stack's
models name, each checked against the Hub's sha256, and record where each came from in the stack's lock
(`STACK.calibration.json`: repository, commit, sizes, checksums and the header facts)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RuntimeFailure, UsageError
from .args import Args

if TYPE_CHECKING:
    from ..hub.ref import HfRef
    from ..hub.remote import Remote
    from ..lockfile import LockEntry
    from ..stack.resolved import LoadedStack


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("pull", help="download the models' Hugging Face Hub files (hf = …), checksums verified")
    p.add_argument("stack", help="the stack file (TOML)")
    p.add_argument("models", nargs="*", metavar="MODEL", help="only these models (default: every one with hf)")
    p.add_argument("--dry-run", action="store_true", help="say what would be downloaded, and how much; fetch nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash the files already here again (without it, a file verified at its download whose size and mtime "
        "are unchanged since is taken as it was)",
    )
    p.set_defaults(func=run)


@dataclass(frozen=True)
class PullArgs(Args):
    stack: str
    models: list[str]
    dry_run: bool
    quiet: bool
    verify: bool


def run(ns: argparse.Namespace) -> int:
    args = PullArgs.of(ns)
    from ..hub.ref import HubFailure
    from ..stack.resolve import load_stack
    from .common import hub_header

    stack = Path(args.stack)
    loaded = load_stack(stack, shown=args.stack, hub=hub_header)
    for warning in loaded.warnings:
        if "not downloaded yet" not in warning:  # that is what pull is for
            print(f"warning: {warning}", file=sys.stderr)
    wanted = _wanted(loaded, args)
    entries = dict(loaded.calibration)
    done = 0
    try:
        for name, key, ref, dest in wanted:
            done += _one(loaded, entries, name, key, ref, dest, args)
    except HubFailure as exc:
        _save(stack, entries, done)
        raise RuntimeFailure(f"umemc pull: {exc}") from None
    _save(stack, entries, done)
    return 0


def _wanted(loaded: LoadedStack, args: PullArgs) -> list[tuple[str, str, HfRef, Path]]:
    from ..catalog.runtimes import ENGINE_RUNTIMES
    from ..hub.directory import parse_repo
    from ..hub.ref import parse

    unknown = [m for m in args.models if m not in loaded.models]
    if unknown:
        raise UsageError(f"umemc pull: no model {unknown[0]!r} in {args.stack}")
    out = []
    for m in loaded.models.values():
        if args.models and m.name not in args.models:
            continue
        spec = m.spec
        for key, value, path in (("hf", spec.hf, m.model_path), ("mmproj_hf", spec.mmproj_hf, m.mmproj_path)):
            if value is not None and path is not None:
                whole = spec.runtime in ENGINE_RUNTIMES  # a model directory: the whole repository
                out.append((m.name, key, (parse_repo if whole else parse)(value, spec.hf_revision), path))
    if not out:
        raise UsageError(
            f'umemc pull: no model of {args.stack} names a Hub file (hf = "owner/repo/file.gguf") or, for vLLM and '
            'MLX, a repository (hf = "owner/repo")'
        )
    return out


def _one(
    loaded: LoadedStack,
    entries: dict[str, LockEntry],
    name: str,
    key: str,
    ref: HfRef,
    dest: Path,
    args: PullArgs,
) -> int:
    """Pull one file (all its parts); returns 1 when the lock gained something to record."""
    from ..estimate.hub_header import header_fields
    from ..hub.directory import pull_remote
    from ..hub.download import needed, pull
    from ..hub.remote import describe
    from ..units import human

    if ref.path:
        remote = describe(ref, header_fields)
        parts = f" ({len(remote.parts)} parts)" if len(remote.parts) > 1 else ""
    else:  # vLLM's and MLX's model directory
        remote = pull_remote(ref)
        parts = f" ({len(remote.parts)} files)"
    total = sum(p.size for p in remote.parts)
    what = f"{ref.repo}/{ref.path}" if ref.path else ref.repo
    if args.dry_run:
        todo = needed(remote, dest)
        state = "here" if not todo else f"{human(todo)} to download"
        print(f"{name}: {what}{parts} at {remote.commit[:12]}, {human(total)} -> {dest}: {state}")
        return 0
    start = time.monotonic()
    fetched = pull(remote, dest, progress=not args.quiet, verify=args.verify)
    took = time.monotonic() - start
    got = sum(f.downloaded for f in fetched)
    if not all(f.verified for f in fetched):
        checked = "no sha256 from the Hub"
    elif any(f.recorded for f in fetched):  # say what was checked: not the bytes, this time
        checked = "sha256 verified at its download, size and mtime unchanged since (--verify hashes it again)"
    else:
        checked = "sha256 verified"
    said = f"downloaded {human(got)} in {took:.1f} s" if got else "already here"
    print(f"{name}: {what}{parts} at {remote.commit[:12]} -> {dest}: {said}, {checked}")
    if key != "hf" or loaded.models[name].spec.runtime not in _llama():
        return 0
    entries[name] = _entry(entries.get(name), remote, dest)
    return 1


def _llama() -> tuple[str, ...]:
    from ..catalog.runtimes import LLAMA_RUNTIMES

    return tuple(LLAMA_RUNTIMES)


def _entry(old: LockEntry | None, remote: Remote, dest: Path) -> LockEntry:
    """The lock's entry for the downloaded file: its identity, its header, where it came from; a dry run
    recorded on the header's sparse copy still holds (the same identity and header)."""
    from msgspec.structs import replace

    from .. import lockfile
    from ..estimate.gguf_file import locked_header, read

    origin = lockfile.HubOrigin(
        repo=remote.ref.repo,
        path=remote.ref.path,
        revision=remote.ref.revision,
        commit=remote.commit,
        parts=[lockfile.HubPart(path=p.path, size=p.size, sha256=p.sha256) for p in remote.parts],
        header_bytes=0,
    )
    ident = lockfile.identity(dest)
    base = old if old is not None and old.file == ident else lockfile.LockEntry()
    return replace(base, file=ident, hub=origin, header=locked_header(read(dest)))


def _save(stack: Path, entries: dict[str, LockEntry], changed: int) -> None:
    from .. import lockfile

    if not changed:
        return
    try:
        path = lockfile.save(stack, entries)
    except OSError as exc:
        print(f"warning: cannot record the downloads in {lockfile.path_for(stack)}: {exc.strerror}", file=sys.stderr)
        return
    print(f"recorded in {path}")
