"""Unix socket paths are limited to 107 bytes: a deep run dir gets its socket in a short private
directory, recorded in the run dir and reused."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from umemc.runtime.rundir import SOCKET_MAX, RunDir


def test_short_run_dir_keeps_its_socket(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    assert run.claim_socket() == run.socket()
    assert run.socket() == tmp_path / "run" / "state" / "supervisor.sock"


def test_deep_run_dir_gets_a_private_short_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    run = RunDir(deep)
    assert len(str(run.default_socket())) > SOCKET_MAX
    sock = run.claim_socket()
    assert len(str(sock)) <= SOCKET_MAX
    private = Path(sock).parent
    try:
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700 and private.stat().st_uid == os.getuid()
        assert (deep / "state" / "socket").read_text() == f"{sock}\n"
        assert run.claim_socket() == sock and run.socket() == sock  # recorded: the same one next time
    finally:
        shutil.rmtree(private)
