"""Asking a platform tool (nvidia-smi, pmset) for what it prints: one way for every probe that runs one. Apart
from the package's own module so that the exec wrapper, which reads /proc through the probes, loads no subprocess."""

from __future__ import annotations

import shutil
import subprocess


def answer(argv: list[str], timeout: float = 5.0) -> str | None:
    """What a platform tool prints (nvidia-smi, pmset) when it answers with exit 0; None where it is not installed,
    fails or stays silent past `timeout`."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
