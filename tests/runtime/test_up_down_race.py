"""`umemc down` while an `umemc up` is still bringing the stack up (its first second: building, preflight, starting
supervisord) stops that `up` first and then the stack: nothing comes up behind a `down` that returned, and `down`
never says "nothing to stop" of a stack that is starting."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import patience
from tests.runtime.conftest import free_port, live_sysctl_table, worker
from umemc.runtime.uplock import holder

pytestmark = pytest.mark.slow


def test_down_during_up_stops_the_up_and_what_it_started(tmp_path: Path) -> None:
    stack = tmp_path / "stack.toml"
    stack.write_text(
        'version = 1\nname = "race"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n' + live_sysctl_table()
        + f"[gateway]\nport = {free_port()}\n"
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
    )  # fmt: skip
    run = tmp_path / "run"
    up = subprocess.Popen([sys.executable, "-m", "umemc", "up", str(stack), "--run-dir", str(run)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + patience(60)
        while holder(run / "up.lock") is None:  # up holds its lock from its first step
            assert up.poll() is None and time.monotonic() < deadline, "up never took its lock"
            time.sleep(0.01)
        down = subprocess.run([sys.executable, "-m", "umemc", "down", "--run-dir", str(run)], capture_output=True,
                              text=True, timeout=patience(120), check=False)  # fmt: skip
        assert down.returncode == 0, down.stdout + down.stderr
        assert down.stdout.splitlines()[0] == (
            f"down: an `umemc up` (pid {up.pid}) was bringing this stack up: stopped it first"
        )
        assert up.wait(timeout=patience(60)) == 130  # interrupted, as by Ctrl-C
        left = [p for p in psutil.process_iter(["cmdline"]) if str(run) in " ".join(p.info["cmdline"] or [])]
        assert left == [], left
        assert holder(run / "up.lock") is None
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        subprocess.run([sys.executable, "-m", "umemc", "down", "--run-dir", str(run)], capture_output=True,
                       timeout=patience(120), check=False)  # fmt: skip


def test_a_second_up_is_refused_while_the_first_holds_the_run(tmp_path: Path) -> None:
    from umemc.runtime.uplock import hold

    fd = hold(tmp_path / "up.lock")
    try:
        child = subprocess.run(
            [sys.executable, "-c", "import sys; from umemc.runtime.uplock import hold; hold(__import__('pathlib')"
             ".Path(sys.argv[1]))", str(tmp_path / "up.lock")],
            capture_output=True, text=True, timeout=patience(60), check=False,
        )  # fmt: skip
        assert child.returncode == 1 and child.stderr.strip().endswith(
            f"UpInProgress: another `umemc up` (pid {os.getpid()}) is bringing this run up"
        )
    finally:
        os.close(fd)
    assert holder(tmp_path / "up.lock") is None


def test_an_up_killed_with_sigkill_leaves_no_lock(tmp_path: Path) -> None:
    """The kernel drops a flock with its holder: an `up` killed -9 never blocks the next `up` or `down`."""
    lock = tmp_path / "up.lock"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from umemc.runtime.uplock import hold; hold(__import__('pathlib')"
         ".Path(sys.argv[1])); print('held', flush=True); time.sleep(600)", str(lock)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        assert holder(lock) is not None and holder(lock).pid == child.pid  # type: ignore[union-attr]
        os.kill(child.pid, 9)
        child.wait(timeout=patience(30))
        assert holder(lock) is None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
