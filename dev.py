#!/usr/bin/env python3
"""Set-up and entry points for a fresh checkout; needs nothing but python3.

    python3 dev.py example   # make .venv, install umemc, build the bundled Strix Halo stack
    python3 dev.py test      # make .venv with the test extras, run the whole test suite (pytest)

Optional parts the marked tests use (they skip, saying why, where these are absent):
    python3 dev.py setup-llama   # llama-cpp-python[server]: compiles llama.cpp, ~5 min on 2 cores
    python3 dev.py setup-torch   # torch==2.13.0 (CPU wheel)

The venv is (re)installed only when pyproject.toml changed since the last install.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"


def ensure_venv(extras: str) -> None:
    stamp = VENV / f".installed-{extras or 'base'}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and PY.exists():
        return
    if not PY.exists():
        print(f"creating {VENV} ...", flush=True)
        try:
            venv.create(VENV, with_pip=True)
        except Exception as exc:  # noqa: BLE001 - Debian's python3 lacks ensurepip until python3-venv is installed
            sys.exit(f"cannot create a virtual environment ({exc}); on Debian: apt-get install python3-venv")
    spec = f".[{extras}]" if extras else "."
    print(f"installing umemc{f'[{extras}]' if extras else ''} into {VENV} ...", flush=True)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True, cwd=ROOT)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "-e", spec], check=True, cwd=ROOT)
    stamp.write_text(digest)


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "help"
    if what == "example":
        ensure_venv("")
        stack = argv[1] if len(argv) > 1 else "examples/strix-halo-5.toml"
        return subprocess.run([str(VENV / "bin" / "umemc"), "build", stack, "--files-later"], cwd=ROOT).returncode
    if what in ("setup-llama", "setup-torch"):
        ensure_venv("test")
        spec = ["llama-cpp-python[server]"] if what == "setup-llama" else ["torch==2.13.0"]
        return subprocess.run([str(PY), "-m", "pip", "install", "-q", *spec], cwd=ROOT).returncode
    if what == "test":
        ensure_venv("test")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run([str(PY), "-m", "pytest", *argv[1:]], cwd=ROOT, env=env).returncode
    print(__doc__)
    return 0 if what in ("help", "-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
