"""What preflight found, and the report `umemc up` prints: problems grouped by the one command that fixes them
(a stock kernel meets a Strix Halo stack with a dozen problems and three fixes), each group saying whether the
fix needs a reboot, and a summary line."""

from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    message: str
    fix: tuple[str, ...] = ()  # the one command (or action) that fixes it first, then alternatives and notes
    host: bool = False  # a setting of hardware a rehearsal does not use: a warning only under --simulate
    advisory: bool = False  # never refuses (swap on, no cgroups): shown as a warning
    reboot: bool = False  # the fix takes effect after a reboot

    @classmethod
    def passed(cls, check: str, message: str, **kw: Any) -> Finding:
        return cls(check, ok=True, message=message, **kw)

    @classmethod
    def failed(cls, check: str, message: str, fix: tuple[str, ...] = (), **kw: Any) -> Finding:
        return cls(check, ok=False, message=message, fix=fix, **kw)


def umemc_command(*args: str, sudo: bool = False) -> str:
    """This umemc run again, as a shell command: by the interpreter it runs under (root's PATH has no venv's
    `umemc`), or as `umemc` where that is the one on PATH."""
    script = shutil.which("umemc")
    same = script is not None and _shebang(script) == sys.executable
    argv = ["umemc", *args] if same and not sudo else [sys.executable, "-m", "umemc", *args]
    return shlex.join(["sudo", *argv] if sudo else argv)


def _shebang(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            first = f.readline(4096).decode(errors="replace").strip()
    except OSError:
        return None
    return first[2:].strip() if first.startswith("#!") else None


def report(findings: list[Finding], blocking: list[Finding], *, skipped: bool = False) -> tuple[list[str], str | None]:
    """The lines `umemc up` prints (rich markup) and, when it refuses, the summary line for stderr: what passed,
    one line each; then each fix (the first command of a finding's fix) with the problems it fixes."""
    lines = [f"  [green]ok[/]    {f.check}: {f.message}" for f in findings if f.ok]
    problems = [f for f in findings if not f.ok]
    groups: dict[str, list[Finding]] = {}
    # root's commands first (one `umemc apply` fixes most of a stock kernel), freeing memory last
    for f in sorted(problems, key=lambda f: (not (f.fix and f.fix[0].startswith("sudo ")), f.check == "memory")):
        groups.setdefault(f.fix[0] if f.fix else "", []).append(f)
    reboots = sum(1 for fs in groups.values() if any(f.reboot for f in fs))
    if problems:
        lines.append(
            f"  {_count(len(problems), 'problem')}, {_count(len(groups), 'fix', 'fixes')}"
            + (f" ({reboots} after a reboot)" if reboots else "")
            + ":"
        )
    for i, (fix, fs) in enumerate(groups.items(), 1):
        when = " (after a reboot)" if any(f.reboot for f in fs) else " (no reboot)" if fix.startswith("sudo ") else ""
        lines.append(f"  [bold]fix {i}[/]{when}: {fix or 'see below'}")
        for f in fs:
            label = "[red]FAIL[/]" if f in blocking else "[yellow]warn[/]"
            lines.append(f"    {label}  {f.check}: {f.message}")
        seen: list[str] = []
        for f in fs:
            seen += [x for x in f.fix[1:] if x not in seen]
        lines += [f"          {x}" for x in seen]
    if not blocking:
        return lines, None
    fixes = {f.fix[0] if f.fix else "" for f in blocking}
    names = sorted({f.check for f in blocking})
    summary = (
        f"umemc up: preflight refused: {_count(len(blocking), 'problem')}, {_count(len(fixes), 'fix', 'fixes')} above"
        + (f" ({reboots} after a reboot)" if reboots else "")
        + "; fix them, or start anyway with "
        + " ".join(f"--skip {shlex.quote(n)}" for n in names)
    )
    return lines, summary


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"
