"""Asking a platform tool (nvidia-smi, pmset) for what it prints: one way for every probe that runs one. Apart
from the package's own module so that the exec wrapper, which reads /proc through the probes, loads no subprocess.
The program is the machine's own, or the recorded machine's (umemc.runtime.probes.hostroot)."""

from __future__ import annotations

import subprocess

from .hostroot import program


def answer(argv: list[str], timeout: float = 5.0) -> str | None:
    """What a platform tool prints (nvidia-smi, pmset) when it answers with exit 0; None where it is not installed,
    fails or stays silent past `timeout`."""
    found = program(argv[0])
    if found is None:
        return None
    try:
        done = subprocess.run([found, *argv[1:]], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
