"""The stacks a user runs, known from anywhere: `up` records each running stack (its name, run dir, stack file and
gateway) in the user's state directory, `down` forgets it, and `umemc ps` lists them; `status`, `down`, `logs`,
`events` and `chat` find a stack by its name there.

The directory follows the platform's convention: $XDG_STATE_HOME/umemc/runs (default ~/.local/state/umemc/runs) on
Linux, ~/Library/Application Support/umemc/runs on macOS; $UMEMC_STATE_HOME replaces the umemc directory (tests,
several users' views). One small JSON file per stack, named by the stack, written atomically, mode 0600 in a 0700
directory. A record is a pointer, never trusted further: the run dir it names is what is read, and a record that is
unreadable or names no run is said and skipped."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..chars import shown
from ..errors import UsageError
from ..records import read_file, write_atomic

MAX_RECORD_BYTES = 64 * 1024


def home() -> Path:
    given = os.environ.get("UMEMC_STATE_HOME")
    if given:
        return Path(given)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "umemc"
    xdg = os.environ.get("XDG_STATE_HOME")  # the XDG base directory spec's default: $HOME/.local/state
    return Path(xdg if xdg and os.path.isabs(xdg) else os.path.expanduser("~/.local/state")) / "umemc"


def runs_dir() -> Path:
    return home() / "runs"


@dataclass(frozen=True)
class RunRecord:
    name: str
    run_dir: str
    stack_file: str | None
    gateway: str | None  # its URL, where the stack has one

    def as_json(self) -> dict[str, str | None]:
        return {"name": self.name, "run_dir": self.run_dir, "stack_file": self.stack_file, "gateway": self.gateway}


def remember(record: RunRecord) -> str | None:
    """Record a stack that runs; None, or why it could not be recorded (the stack runs all the same)."""
    folder = runs_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for other in _records():  # one record per run dir: a stack renamed in place replaces its old record
            if other[1].run_dir == record.run_dir and other[1].name != record.name:
                other[0].unlink(missing_ok=True)
        write_atomic(folder / f"{record.name}.json", json.dumps(record.as_json(), indent=2) + "\n")
    except OSError as exc:
        return f"cannot record the stack in {folder}: {exc.strerror or exc}"
    return None


def forget(run_dir: Path) -> None:
    """The records of the stack that ran from `run_dir` (it was brought down)."""
    for path, record in _records():
        if Path(record.run_dir) == run_dir:
            path.unlink(missing_ok=True)


def known() -> tuple[list[RunRecord], list[str]]:
    """The recorded stacks by name, and one line for each record that could not be read."""
    read = _scan()
    return [r for _, r in read if not isinstance(r, str)], [r for _, r in read if isinstance(r, str)]


def find(name: str) -> Path:
    """The run dir of the stack recorded under `name`, or started from the stack file `name` names."""
    records, _ = known()
    for record in records:
        if record.name == name:
            return Path(record.run_dir)
    given = Path(name)
    if given.suffix == ".toml" or os.sep in name:  # a stack file: the run started from it
        target = given.resolve()
        for record in records:
            if record.stack_file is not None and Path(record.stack_file).resolve() == target:
                return Path(record.run_dir)
    names = ", ".join(shown(r.name) for r in records) or "none"
    raise UsageError(f"no running stack named {name!r} (running: {names}; `umemc ps` lists them)")


def _records() -> list[tuple[Path, RunRecord]]:
    return [(path, r) for path, r in _scan() if not isinstance(r, str)]


def _scan() -> list[tuple[Path, RunRecord | str]]:
    """Each record file in the folder, read (a record, or why it could not be)."""
    folder = runs_dir()
    return [(path, _read(path)) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def _read(path: Path) -> RunRecord | str:
    try:
        doc = json.loads(read_file(path, MAX_RECORD_BYTES))
    except (OSError, ValueError, RecursionError) as exc:
        return f"{path}: unreadable ({'it nests too deep' if isinstance(exc, RecursionError) else exc})"
    fields = ("name", "run_dir", "stack_file", "gateway")
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or not isinstance(doc.get("run_dir"), str):
        return f"{path}: not a umemc run record"
    if any(doc.get(k) is not None and not isinstance(doc.get(k), str) for k in fields):
        return f"{path}: not a umemc run record"
    if path.name != f"{doc['name']}.json":  # umemc writes NAME.json: another file claiming NAME is not its record
        return f"{path}: claims the stack name {shown(doc['name'])!r}, which is not its own file's: not used"
    return RunRecord(doc["name"], doc["run_dir"], doc.get("stack_file"), doc.get("gateway"))
