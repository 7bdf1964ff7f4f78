"""The benches time what they claim: their generated stacks are valid and checked, and a timed command that fails
stops the bench instead of timing its error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.check_speed import big_stack
from bench.common import timed


def test_the_check_bench_stack_is_checked_to_the_end(tmp_path: Path) -> None:
    """The 1000-model stack of bench/check_speed.py (here 20 of them) is a valid stack that fits: `check` reads
    every model, not only the first (an invalid one exits 2 at its first model)."""
    stack = big_stack(tmp_path / "big.toml", 20)
    done = subprocess.run(
        [sys.executable, "-m", "umemc", "check", str(stack), "--format", "json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('"mode": "hot"') + done.stdout.count('"mode": "cold"') == 20


def test_a_timed_command_that_fails_stops_the_bench(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('version = 1\nname = "x"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n[models.a]\nruntime = 1\n')
    with pytest.raises(SystemExit) as stopped:
        timed([sys.executable, "-m", "umemc", "check", str(bad)])
    said = str(stopped.value.code)
    assert said.startswith(f"bench: {sys.executable} -m umemc check {bad} exited 2, so it times nothing:\n")
    assert f"{bad}:7:11: models.a.runtime" in said
    assert timed([sys.executable, "-c", "raise SystemExit(1)"], ok=(0, 1)) > 0
