"""The exec wrapper's gate (umemc.runtime.wrap.pass_gate): a cold start's wrapper is started while the models it
evicts stop, and execs the worker only once their processes have exited. Real processes: the wrapper as bundles run
it (`python -I -S wrap_entry.py ...`), a `sleep` standing for the victim, start times read from /proc here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import patience
from tests.runtime.conftest import start_of
from umemc.names import WRAP_ENTRY
from umemc.records import gate_text

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfd and /proc: Linux")


def wrapped(tmp_path: Path) -> list[str]:
    """The wrapper's argv as a bundle writes it, for a worker that leaves a mark."""
    argv = [sys.executable, "-I", "-S", WRAP_ENTRY, "--stack", "s", "--model", "m", "--hard", "0", "--soft", "0"]
    argv += ["--cgroup", "off", "--state", str(tmp_path / "state"), "--outlive-parent", "--"]
    return [*argv, "/bin/sh", "-c", f"echo ran > {tmp_path / 'ran'}"]


def gate(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "state" / "gates" / "m"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def until_true(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + patience(timeout)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def waiting_on_a_pidfd(pid: int) -> bool:
    """The wrapper holds a pidfd (pidfd_open(2): `anon_inode:[pidfd]`) only while it waits at its gate."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[pidfd]" for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_the_gate_text_is_until_then_one_process_a_line() -> None:
    assert gate_text(1700000000.5, [(41, 900, "a"), (42, 901, "b")]) == "until 1700000000.500\n41 900 a\n42 901 b\n"


def test_the_worker_runs_only_after_the_victim_has_exited(tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "600"])
    try:
        gate(tmp_path, f"until {time.time() + 600}\n{victim.pid} {start_of(victim.pid)} old\n")
        wrapper = subprocess.Popen(wrapped(tmp_path), stderr=subprocess.PIPE, text=True)
        try:
            until_true(lambda: waiting_on_a_pidfd(wrapper.pid), "the wrapper to wait at its gate")
            assert wrapper.poll() is None and not (tmp_path / "ran").exists()
            assert (tmp_path / "state" / "pids" / "m").read_text() == f"{wrapper.pid} {start_of(wrapper.pid)}\n"
            victim.kill()
            assert wrapper.wait(timeout=patience(30)) == 0, wrapper.stderr.read() if wrapper.stderr else ""
            assert (tmp_path / "ran").read_text() == "ran\n"
        finally:
            wrapper.kill()
            wrapper.wait()
    finally:
        victim.kill()
        victim.wait()


def test_a_victim_that_is_a_zombie_has_exited(tmp_path: Path) -> None:
    """Exited but not reaped (its parent has not waited): its memory is free, the worker starts."""
    victim = subprocess.Popen(["true"])
    until_true(lambda: Path(f"/proc/{victim.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", "a zombie")
    gate(tmp_path, f"until {time.time() + 600}\n{victim.pid} {start_of(victim.pid)} old\n")
    done = subprocess.run(wrapped(tmp_path), capture_output=True, text=True, timeout=patience(30))
    victim.wait()
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "ran").read_text() == "ran\n"


def test_a_pid_now_another_process_is_not_waited_for(tmp_path: Path) -> None:
    """The gate names a process by pid and start time: this (live) test process with another start time is a reused
    pid, not the victim."""
    gate(tmp_path, f"until {time.time() + 600}\n{os.getpid()} {start_of(os.getpid()) + 1} old\n")
    done = subprocess.run(wrapped(tmp_path), capture_output=True, text=True, timeout=patience(30))
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "ran").read_text() == "ran\n"


def test_a_victim_still_running_at_the_deadline_keeps_the_worker_from_starting(tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "600"])
    try:
        gate(tmp_path, f"until {time.time() - 1}\n{victim.pid} {start_of(victim.pid)} old\n")
        done = subprocess.run(wrapped(tmp_path), capture_output=True, text=True, timeout=patience(30))
    finally:
        victim.kill()
        victim.wait()
    assert done.returncode == 1
    assert done.stderr == (
        f"umemc-wrap: not starting m: old (pid {victim.pid}), which it evicts, was still running at its gate's "
        "deadline\n"
    )
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("text", ["", "until soon\n", "41 900 a\n", "until {later}\n41 900\n", "until 1 2\n"])
def test_a_gate_that_does_not_parse_keeps_the_worker_from_starting(tmp_path: Path, text: str) -> None:
    """A corrupt gate never lets a worker start beside memory that may not be free yet (the gateway writes a fresh
    gate, or removes it, at every start)."""
    path = gate(tmp_path, text.format(later=time.time() + 600))  # the test's id stays one text (parallel runs)
    done = subprocess.run(wrapped(tmp_path), capture_output=True, text=True, timeout=patience(30))
    assert done.returncode == 1
    assert done.stderr == (
        f"umemc-wrap: not starting m: its gate {path} is not `until T` and `pid starttime name` lines\n"
    )
    assert not (tmp_path / "ran").exists()
