"""The package is `mypy --strict` clean (pyproject.toml [tool.mypy]) with pydantic's plugin, and ruff-clean."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # mypy --strict and ruff over the whole tree

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy not installed (test extra)")
def test_mypy_strict_clean() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "umemc", "integrations"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff not installed (test extra)")
@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_clean(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
