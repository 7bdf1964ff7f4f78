"""The package is mypy-clean (STYLE.md §10), with pydantic's plugin."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy not installed (test extra)")
def test_mypy_clean() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "umemc"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
