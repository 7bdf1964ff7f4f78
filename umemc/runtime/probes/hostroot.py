"""Where umemc reads the machine from: this one, or a recorded one.

`UMEMC_HOST_ROOT=DIR` replays a recorded machine (docs/PLATFORMS.md): every file umemc reads to learn the machine
(under /proc, /sys and /etc: memory, the GPU window, the driver's parameters, heat, pressure) is read under DIR
instead, and every program it runs for that (nvidia-smi, sysctl, pmset, vm_stat, uname) is taken from DIR/bin and
from nowhere else: a recorded Mac replayed on Linux must not reach Linux's own `sysctl`. `umemc doctor --capture`
writes such a DIR from a real machine (umemc.runtime.probes.capture).

What a process holds, the process table and the cgroups are always this machine's: they belong to the workers umemc
starts, not to the machine being described. Apart from the probes' other modules so that the exec wrapper (which
runs with -S and loads as little as it can) may import it."""

from __future__ import annotations

import os
import shutil
import sys
from functools import lru_cache
from pathlib import Path

HOST_ROOT = "UMEMC_HOST_ROOT"


def recorded() -> Path | None:
    """The recorded machine's directory, None on the real one."""
    value = os.environ.get(HOST_ROOT)
    return Path(value) if value else None


def root() -> Path:
    """Where the machine's files are read: / or the recorded machine's directory."""
    return recorded() or Path("/")


def path(absolute: str) -> Path:
    """A machine file (`/proc/meminfo`) where umemc reads it now."""
    return root() / absolute.lstrip("/")


def program(name: str) -> str | None:
    """The program umemc runs to ask the machine (nvidia-smi, sysctl, pmset…): DIR/bin/NAME on a recorded machine
    (None where it was not recorded: that machine did not have it), else found on PATH."""
    where = recorded()
    if where is None:
        return shutil.which(name)
    candidate = where / "bin" / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def host_os() -> str:
    """The machine's operating system as sys.platform spells it: `linux` or `darwin` of a recorded machine (its
    recorded `uname -s`, else a /proc of its own means Linux), else this interpreter's."""
    where = recorded()
    return sys.platform if where is None else _recorded_os(where)


@lru_cache(maxsize=8)
def _recorded_os(where: Path) -> str:
    """A recorded machine's OS, asked of its `uname` once per directory (every reader of the machine asks)."""
    uname = where / "bin" / "uname"
    if uname.is_file():
        import subprocess

        try:
            said = subprocess.run([str(uname), "-s"], capture_output=True, text=True, timeout=5, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            said = ""
        if said.strip():
            return said.strip().lower()
    return "linux" if (where / "proc").is_dir() else sys.platform
