"""umemc's supervisord runs the exec wrapper in the child it forks for a program (umemc.runtime.supervisord), where
supervisor would exec the wrapper's interpreter first. Real supervisord (`python -m umemc.runtime.supervisord`) on a
config written here; the program's command names as its interpreter a script that leaves a mark and then execs
Python: the mark is left only where that interpreter was run (a stock supervisord runs it; umemc's does not)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.conftest import start_of
from tests.runtime.test_gate import until_true as until
from tests.runtime.test_gate import waiting_on_a_pidfd
from umemc.names import WRAP_ENTRY
from umemc.runtime.supervisor import Supervisor

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal and /proc: Linux"),
]


def interpreter(tmp_path: Path) -> Path:
    """An interpreter that says it was run (a mark), then is Python."""
    path = tmp_path / "python"
    path.write_text(f'#!/bin/sh\ntouch {tmp_path}/interpreter-ran\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


def config(tmp_path: Path, command: list[str]) -> Path:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    wrap = [
        str(interpreter(tmp_path)),
        "-I",
        "-S",
        WRAP_ENTRY,
        "--stack",
        "s",
        "--model",
        "m",
        "--hard",
        "0",
        "--soft",
        "0",
    ]
    wrap += ["--cgroup", "off", "--state", str(state), "--"]
    conf = tmp_path / "supervisord.conf"
    conf.write_text(
        f"[supervisord]\nlogfile={tmp_path}/supervisord.log\npidfile={tmp_path}/supervisord.pid\n"
        f"[unix_http_server]\nfile={tmp_path}/s.sock\nchmod=0700\n"
        "[rpcinterface:supervisor]\nsupervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n"
        f"[program:m]\ncommand={' '.join(wrap + command)}\nautostart=false\nautorestart=false\nstartsecs=0\n"
        f'stopwaitsecs=600\nenvironment=UMEMC_ENV_GREETING="hello"\nstderr_logfile={tmp_path}/m.err\n'
    )
    return conf


@pytest.fixture
def supervisord(tmp_path: Path) -> Iterator[callable]:
    started: list[subprocess.Popen[bytes]] = []

    def start(conf: Path) -> tuple[subprocess.Popen[bytes], Supervisor]:
        proc = subprocess.Popen([sys.executable, "-m", "umemc.runtime.supervisord", "-n", "-c", str(conf)])
        started.append(proc)
        sup = Supervisor(tmp_path / "s.sock")
        until(sup.alive, "supervisord to answer")
        return proc, sup

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def pid_of(sup: Supervisor) -> int:
    return int(sup.processes()["m"]["pid"])


def test_the_wrapper_runs_in_supervisords_child_and_execs_the_worker(tmp_path: Path, supervisord) -> None:
    out = tmp_path / "out"
    script = f'echo "$GREETING $UMEMC_RUN" > {out}.part && mv {out}.part {out} && exec sleep 600'
    proc, sup = supervisord(config(tmp_path, ["/bin/sh", "-c", f"'{script}'"]))
    sup.start("m", wait=True)
    until(out.exists, "the worker's mark")
    pid = pid_of(sup)
    greeting, mark = out.read_text().split()
    assert greeting == "hello"  # the model's variable given its name, as the wrapper does
    assert mark == hashlib.sha256(os.path.realpath(tmp_path / "state").encode()).hexdigest()[:8]  # the run's mark
    # the pid supervisord started is the worker's (no process between them), and the wrapper recorded it
    assert (tmp_path / "state" / "pids" / "m").read_text() == f"{pid} {start_of(pid)}\n"
    until(lambda: os.readlink(f"/proc/{pid}/exe").endswith("/sleep"), "the worker's exec")
    assert os.getppid() != pid and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(proc.pid)
    assert not (tmp_path / "interpreter-ran").exists()  # no interpreter ran between supervisord and the worker
    sup.stop("m", wait=True)


def test_a_stock_supervisord_runs_the_interpreter(tmp_path: Path) -> None:
    """The other side of the test above: the same program under supervisor's own supervisord runs the wrapper's
    interpreter (the mark), which then runs the wrapper and the worker as before."""
    out = tmp_path / "out"
    conf = config(tmp_path, ["/bin/sh", "-c", f"'echo $GREETING > {out}.part && mv {out}.part {out}'"])
    proc = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-n", "-c", str(conf)])
    try:
        sup = Supervisor(tmp_path / "s.sock")
        until(sup.alive, "supervisord to answer")
        sup.start("m", wait=False)
        until(out.exists, "the worker's mark")
        assert out.read_text() == "hello\n"
        assert (tmp_path / "interpreter-ran").exists()
    finally:
        proc.kill()
        proc.wait()


def test_the_worker_dies_with_a_killed_supervisord(tmp_path: Path, supervisord) -> None:
    proc, sup = supervisord(config(tmp_path, ["sleep", "600"]))
    sup.start("m", wait=True)
    pid = pid_of(sup)
    until(lambda: os.readlink(f"/proc/{pid}/exe").endswith("/sleep"), "the worker's exec")
    proc.kill()  # kill -9: the parent-death signal the wrapper asked for in the child takes the worker
    proc.wait()
    until(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3],
          "the worker's end")  # fmt: skip


def test_a_stop_ends_a_wrapper_waiting_at_its_gate(tmp_path: Path, supervisord) -> None:
    """supervisord's own signal handlers only note a signal: the child resets them, so a SIGTERM ends a wrapper
    that waits for an evicted model's exit (stopwaitsecs is 600: a child that ignored it would hang the stop)."""
    victim = subprocess.Popen(["sleep", "600"])
    try:
        gates = tmp_path / "state" / "gates"
        gates.mkdir(parents=True)
        (gates / "m").write_text(f"until {time.time() + 600}\n{victim.pid} {start_of(victim.pid)} old\n")
        proc, sup = supervisord(config(tmp_path, ["/bin/sh", "-c", f"'echo ran > {tmp_path}/ran'"]))
        sup.start("m", wait=False)
        until(lambda: pid_of(sup) and waiting_on_a_pidfd(pid_of(sup)), "the wrapper to wait at its gate")
        pid = pid_of(sup)
        sup.stop("m", wait=True)
        assert sup.processes()["m"]["statename"] == "STOPPED"
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
        assert victim.poll() is None and not (tmp_path / "ran").exists()
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
