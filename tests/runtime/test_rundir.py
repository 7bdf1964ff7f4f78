"""Unix socket paths are limited to 107 bytes (Linux), and supervisord binds SOCKET.PID before linking it into
place: a deep run dir gets its socket in a short private directory, recorded in the run dir and reused."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
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


def bind(path: Path) -> None:
    """Bind a unix socket where supervisord first binds one: PATH.PID, with the largest pid Linux gives."""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(f"{path}.4194304")
        os.unlink(f"{path}.4194304")


def test_a_socket_path_that_leaves_no_room_for_supervisords_pid_suffix_moves() -> None:
    """A run dir whose socket path is 102 bytes fits sun_path (107) but not supervisord's SOCKET.PID (it said
    "AF_UNIX path too long" and did not start): such a socket moves too; one of 99 bytes stays."""
    tail = len("/run/state/supervisor.sock")
    # a short base of its own: pytest's tmp_path grows with its run and worker numbers (pytest-115/popen-gw2/...)
    # and left no room to make a 99-byte path under it
    base = tempfile.mkdtemp(prefix="u", dir="/tmp") + "/"
    try:
        assert len(base) + tail < 99
        for length, moves in ((102, True), (99, False)):
            where = Path(base + "x" * (length - tail - len(base)))
            run = RunDir(where / "run")
            assert len(str(run.default_socket())) == length
            sock = run.claim_socket()
            try:
                assert (sock != run.default_socket()) is moves
                sock.parent.mkdir(parents=True, exist_ok=True)
                bind(sock)
            finally:
                run.release_socket()
    finally:
        shutil.rmtree(base)


def test_down_leaves_no_half_written_record(tmp_path: Path) -> None:
    """An exec wrapper killed between writing its record's temporary and renaming it (a `down` under load) leaves
    `.NAME.tmp`: the sweep that ends every run removes it with the records of what is gone."""
    from umemc.runtime.members import RunMembers

    run = RunDir(tmp_path / "run")
    run.pids.mkdir(parents=True)
    (run.pids / ".comfy.tmp").write_text("12")
    (run.pids / "gone").write_text("999999999 1\n")
    assert RunMembers(run, "spread").sweep() == ([], {})  # nothing of the run was alive, nothing killed
    assert sorted(p.name for p in run.pids.iterdir()) == []
