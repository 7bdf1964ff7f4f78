"""A failing machine: `kill -9` of supervisord, deleted and corrupt state files, an unusable event log.
Real supervisord, real worker processes, real cgroups (where the machine has them). The promise under
test: nothing of a stack outlives `umemc down`, and nothing stops the enforcer or `down`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import patience
from tests.runtime.conftest import free_port, live_sysctl_table, settled, worker
from umemc.cli import main
from umemc.runtime.cgroups import detect

MiB = 2**20


def head(name: str, policy: str = "") -> str:
    return (
        f'version = 1\nname = "{name}"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        + (f"[policy]\n{policy}\n" if policy else "")
        + live_sysctl_table()
    )


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def record(run_dir: Path, name: str) -> int:
    return int((run_dir / "state" / "pids" / name).read_text().split()[0])


needs_cgroups = pytest.mark.skipif(
    detect("probe")[0] is None, reason=f"no writable memory cgroup here: {detect('probe')[1]}"
)


def up_with_a_grandchild(stack, tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    """A stack whose worker `w` leaves a double-forked `setsid` grandchild, beside a plain worker `s`;
    returns (the running stack, the grandchild's pid file, its pid)."""
    pidfile = tmp_path / "grandchild.pid"
    r = stack(
        head(name)
        + worker("w", "forker.py", "{port}", pidfile, memory="64MiB", port=free_port())
        + worker("s", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
    )
    grandchild = int(r.wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="the grandchild"))
    return r, pidfile, grandchild


def kill_supervisord(r) -> list[int]:  # type: ignore[no-untyped-def]
    """SIGKILL supervisord; wait until the kernel has taken its children with it (PR_SET_PDEATHSIG)."""
    status = r.status()
    children = [status[n]["pid"] for n in status if status[n]["pid"]]
    children += [record(r.run_dir, n) for n in ("umemc-enforcer", "umemc-gateway")]
    sv = record(r.run_dir, "umemc-supervisord")
    assert sv == int((r.run_dir / "state" / "supervisord.pid").read_text())
    os.kill(sv, signal.SIGKILL)
    r.wait_for(
        lambda: not any(alive(p) for p in [sv, *children]), timeout=15, what="supervisord's children to die with it"
    )
    return children


@needs_cgroups
def test_kill9_supervisord_then_status_and_down_find_the_escaped_grandchild(stack, tmp_path: Path, capsys) -> None:
    r, _, grandchild = up_with_a_grandchild(stack, tmp_path, "k9")
    kill_supervisord(r)
    assert alive(grandchild)  # it left the worker's process group: only its cgroup knows it
    sock = r.run_dir / "state" / "supervisor.sock"
    assert sock.exists()
    status = r.status()
    assert (status["w"]["state"], status["w"]["pid"], status["s"]["state"]) == ("ORPHANED", grandchild, "STOPPED")
    assert sock.exists(), "a read-only status removed the socket"
    capsys.readouterr()
    assert r.cli("down") == 0
    assert (
        capsys.readouterr().out == f"down: stack k9 had no supervisord; killed 1 process(es) it left: [{grandchild}]\n"
    )
    assert not alive(grandchild)
    assert not list((r.run_dir / "state").glob("pids/*"))
    assert r.cli("down") == 0
    assert capsys.readouterr().out == "stack k9 is not running\n"


@needs_cgroups
def test_up_after_kill9_stops_the_orphans_instead_of_adopting_them(stack, tmp_path: Path, capsys) -> None:
    r, pidfile, grandchild = up_with_a_grandchild(stack, tmp_path, "adopt")
    kill_supervisord(r)
    pidfile.unlink()
    capsys.readouterr()
    assert main(["up", str(tmp_path / "stack.toml"), "--run-dir", str(r.run_dir), "--timeout", str(patience(60))]) == 0
    out = capsys.readouterr().out
    assert "found 1 process(es) of an earlier run whose supervisord is gone (w): stopped" in out
    assert "found state left by a crashed run (pid file or socket without supervisord): cleaned" in out
    assert not alive(grandchild)
    settled(r)
    status = r.status()
    assert (status["w"]["state"], status["s"]["state"]) == ("RUNNING", "RUNNING")


def test_up_after_kill9_of_supervisord_alone_starts_cleanly(stack, tmp_path: Path, capsys) -> None:
    """Nothing outlived supervisord (its children died with it): the next `up` must not read the dead
    supervisord's record as the new one's (it used to exit 1, "supervisord did not start", while the new
    stack came up), and it starts and serves."""
    r = stack(head("k9up") + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port()))
    old = r.status()["w"]["pid"]
    kill_supervisord(r)
    capsys.readouterr()
    assert main(["up", str(tmp_path / "stack.toml"), "--run-dir", str(r.run_dir), "--timeout", str(patience(60))]) == 0
    out, err = capsys.readouterr()
    assert "supervisord did not start" not in err + out
    assert "found state left by a crashed run (pid file or socket without supervisord): cleaned" in out
    settled(r)
    status = r.status()
    assert status["w"]["state"] == "RUNNING" and status["w"]["pid"] != old


def test_supervisords_own_stderr_holds_no_tracebacks(stack, tmp_path: Path) -> None:
    """supervisor writes bytes to a stream it does not take for text; umemc's wrapper of supervisord's stderr
    used to reject them, so every log line became a TypeError traceback in state/supervisord.stderr.log."""
    r = stack(head("clean") + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port()))
    os.kill(r.status()["w"]["pid"], signal.SIGKILL)  # supervisord logs the exit and the restart
    r.wait_for(lambda: r.status()["w"]["state"] == "RUNNING" and r.events("exit"), what="the restart")
    text = (r.run_dir / "state" / "supervisord.stderr.log").read_text(errors="replace")
    assert "Traceback" not in text and "TypeError" not in text
    # the lines that used to become tracebacks were logged: supervisord's own log has the exit
    from umemc.runtime.rundir import RunDir

    assert "exited: w (terminated by SIGKILL" in RunDir(r.run_dir).supervisord_logfile.read_text()


def test_deleted_pid_file_does_not_lose_the_stack(stack, tmp_path: Path, capsys) -> None:
    r = stack(head("nopid") + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port()))
    sv = record(r.run_dir, "umemc-supervisord")
    (r.run_dir / "state" / "supervisord.pid").unlink()
    assert r.status()["w"]["state"] == "RUNNING"
    capsys.readouterr()
    assert main(["up", str(tmp_path / "stack.toml"), "--run-dir", str(r.run_dir)]) == 0
    assert "stack nopid is already running: reconciling" in capsys.readouterr().out
    assert record(r.run_dir, "umemc-supervisord") == sv  # no second supervisord
    assert r.cli("down") == 0
    assert not alive(sv)


def test_corrupt_plan_json_status_says_so_and_down_stops_everything(stack, run_cli, capsys) -> None:
    r = stack(head("badplan") + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port()))
    capsys.readouterr()
    pid = r.status()["w"]["pid"]
    plan = r.run_dir / "bundle" / "plan.json"
    plan.write_text('{"format": "umemc-plan", "models": ')
    code, out, err = run_cli("status", "--json", "--run-dir", str(r.run_dir))
    assert code == 0
    assert err == (
        f"warning: {plan}: not valid JSON (Expecting value: line 1 column 36 (char 35)); "
        f"`umemc down --run-dir {r.run_dir}` still stops everything the stack started\n"
    )
    shown = json.loads(out)["models"]["w"]
    assert (shown["priority"], shown["mode"]) == (None, None)  # the plan's figures are unknown
    assert {k: shown[k] for k in list(shown)[:7]} | {"rss_bytes": 0} == {
        "state": "RUNNING",
        "pid": pid,
        "rss_bytes": 0,
        "gpu_bytes": 0,
        "quota_soft_bytes": None,
        "quota_hard_bytes": None,
        "restarts": 0,
    }
    assert shown["rss_bytes"] > 5 * MiB  # live figures still come from the enforcer
    code, out, err = run_cli("down", "--run-dir", str(r.run_dir))
    assert (code, err) == (0, "")
    assert out.startswith(f"down: in {r.run_dir} stopped (")
    assert not alive(pid)


LEAK = "leaker.py"


def leaking_stack(name: str) -> str:
    # hard quota 110 MiB (quota_headroom 0.1); the leaker waits 10 s, then grows 100 MiB/s to 400 MiB
    return head(name, 'kernel_enforcement = "off"\nmax_kills = 100') + worker(
        "leak", LEAK, 100, 2, 400, 10, memory="100MiB"
    )


def moved_and_reopened(resets: list[dict[str, Any]], state: Path) -> list[str]:
    """Where the event-log resets say the damaged log went. The writer that found it damaged moves it and says so;
    another process that held the old file open (the gateway, the standby) may then find its file replaced and
    say that it reopened the new one: every reset is one of the two."""
    reopened = {"reason": f"{state / 'events.db'} was deleted or replaced while in use"}
    others = [e["detail"] for e in resets if "moved_to" not in e["detail"]]
    assert others == [reopened] * len(others)
    return [e["detail"]["moved_to"] for e in resets if "moved_to" in e["detail"]]


def test_corrupt_event_log_is_moved_aside_and_the_enforcer_keeps_enforcing(stack, run_cli, capsys) -> None:
    r = stack(leaking_stack("evcorrupt"))
    state = r.run_dir / "state"
    for suffix in ("-wal", "-shm"):
        Path(f"{state / 'events.db'}{suffix}").unlink(missing_ok=True)
    (state / "events.db").write_bytes(b"this is not a database\n" * 512)
    enforcer = record(r.run_dir, "umemc-enforcer")
    os.kill(enforcer, signal.SIGKILL)  # supervisord restarts it; it opens the corrupt log
    r.wait_for(lambda: record(r.run_dir, "umemc-enforcer") != enforcer, what="the enforcer's restart")
    moved = r.wait_for(lambda: list(state.glob("events.db.corrupt-*")), what="the corrupt log moved aside")
    assert moved[0].read_bytes() == b"this is not a database\n" * 512
    kill = r.wait_for(lambda: r.events("hard_limit_kill", "leak"), timeout=40, what="the leaker killed")
    assert kill[0]["detail"]["by"] == "enforcer"
    assert kill[0]["detail"]["usage_bytes"] > kill[0]["detail"]["hard_bytes"] == 110 * MiB
    assert moved_and_reopened(r.events("event_log_reset"), state) == [str(moved[0])]
    capsys.readouterr()
    code, out, err = run_cli("status", "--run-dir", str(r.run_dir))
    assert (code, err) == (0, f"warning: the event log was corrupt: moved to {moved[0]}, a new one started\n")
    (state / "events.db").write_bytes(b"corrupt again\n" * 512)  # down must not care
    pid = r.status()["leak"]["pid"]
    capsys.readouterr()
    code, out, err = run_cli("down", "--run-dir", str(r.run_dir))
    assert code == 0 and out.startswith("down: evcorrupt stopped (")
    assert not alive(pid)


def test_an_event_log_damaged_under_its_writers_is_moved_aside_while_they_run(stack, run_cli, capsys) -> None:
    """The file overwritten in place (same inode) while the enforcer and gateway hold it open: their own
    connections would go on appending to the WAL while every reader failed. The enforcer looks at the file
    afresh every few seconds: it is moved aside and a new log started, with no writer restarted."""
    r = stack(head("evlive") + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port()))
    state = r.run_dir / "state"
    enforcer = record(r.run_dir, "umemc-enforcer")
    with open(state / "events.db", "r+b") as f:
        f.write(b"this is not a database\n" * 512)
    moved = r.wait_for(
        lambda: [p for p in state.glob("events.db.corrupt-*") if not p.name.endswith(("-wal", "-shm"))],
        what="the damaged log moved aside",
    )
    # the enforcer moves the file, opens a new log, then says the reset in it: the move alone is seen first
    r.wait_for(lambda: r.events("event_log_reset"), what="the reset said in the new log")
    assert record(r.run_dir, "umemc-enforcer") == enforcer  # no writer restarted for it
    capsys.readouterr()
    code, out, err = run_cli("events", "--json", "--run-dir", str(r.run_dir))
    assert code == 0
    assert moved_and_reopened([e for e in json.loads(out) if e["kind"] == "event_log_reset"], state) == [str(moved[0])]


def killed_and_taken_over(r: Any, standby: int) -> tuple[int, int]:
    """The enforcer SIGKILLed once it enforces: the standby (the process `standby`, already running) takes over at
    once (its own pid says enforcer_start) and kills the leaker over its hard quota; supervisord restarts the
    killed one. The killed one's pid and the restarted one's."""
    first = r.wait_for(lambda: r.events("enforcer_start"), what="the enforcer's start")
    main = record(r.run_dir, "umemc-enforcer")
    assert [e["detail"]["pid"] for e in first] == [main]  # the standby leaves the lock to umemc-enforcer
    os.kill(main, signal.SIGKILL)
    took = r.wait_for(lambda: r.events("enforcer_start")[1:], what="the standby to take over")
    assert [e["detail"]["pid"] for e in took] == [standby]
    kill = r.wait_for(lambda: r.events("hard_limit_kill", "leak"), timeout=40, what="the leaker killed")
    assert kill[0]["detail"]["by"] == "enforcer" and kill[0]["time"] >= took[0]["time"]
    restarted = r.wait_for(
        lambda: (pid := record(r.run_dir, "umemc-enforcer")) != main and alive(pid) and pid,
        what="umemc-enforcer restarted",
    )
    return main, int(restarted)


def test_the_standby_in_the_gateway_enforces_the_moment_the_enforcer_is_killed_and_hands_back(stack) -> None:
    """Userspace enforcement only (no kernel limit), a stack with a gateway: the enforcer SIGKILLed, the standby (a
    thread of the gateway's process, waiting on the run's enforcer lock) takes over (the gateway's pid says
    enforcer_start, no new process needed) and kills the leaker over its hard quota; supervisord restarts the
    killed one, which waits for the lock, and the standby hands it back and waits again."""
    r = stack(leaking_stack("standby"))
    assert not (r.run_dir / "state" / "pids" / "umemc-enforcer-standby").exists()  # no program of its own
    gateway = record(r.run_dir, "umemc-gateway")
    main, restarted = killed_and_taken_over(r, gateway)
    back = r.wait_for(lambda: r.events("enforcer_start")[2:], what="the lock handed back")
    assert [e["detail"]["pid"] for e in back] == [restarted]
    log = (r.run_dir / "state" / "logs" / "umemc-enforcer.log").read_text()
    assert "umemc-enforcer: standby: another enforcer runs; taking over when it stops\n" in log
    assert "umemc-enforcer: the enforcer that ran stopped: enforcing\n" in log
    assert not (r.run_dir / "state" / "enforcer.ready").exists()  # said while it waited, taken back once it enforces
    gateway_log = r.run_dir / "state" / "logs" / "umemc-gateway.log"
    who = "umemc-gateway: standby enforcer: "
    waiting = who + "standby: another enforcer runs; taking over when it stops"
    said = [waiting, who + "the enforcer that ran stopped: enforcing", who + "the enforcer process waits: "
            "handed the lock back", waiting]  # fmt: skip
    r.wait_for(
        lambda: [x for x in gateway_log.read_text().splitlines() if x.startswith(who)] == said,
        what="the standby's life in the gateway's log: it waited, enforced, handed back, waits again: "
        + repr([x for x in gateway_log.read_text().splitlines() if x.startswith(who)]),
    )
    assert alive(restarted) and alive(gateway)


def test_without_a_gateway_the_standby_is_a_program_that_enforces_the_moment_the_enforcer_is_killed(stack) -> None:
    """A stack without a gateway runs the standby as a program of its own (umemc-enforcer-standby): it takes over
    the moment the enforcer is SIGKILLed; supervisord restarts the killed one, which waits as the new standby."""
    r = stack(leaking_stack("standby-program") + "[gateway]\nenabled = false\n")
    standby = record(r.run_dir, "umemc-enforcer-standby")
    main, restarted = killed_and_taken_over(r, standby)
    log = r.run_dir / "state" / "logs" / "umemc-enforcer.log"
    r.wait_for(lambda: "standby: another enforcer runs" in log.read_text(), what="it to wait as the standby")
    assert [e["detail"]["pid"] for e in r.events("enforcer_start")] == [main, standby]  # it did not take over
    assert alive(restarted)


@needs_cgroups
def test_with_both_enforcers_killed_the_kernel_still_holds_the_hard_quota(stack) -> None:
    """The enforcer and its standby (the gateway's process, where it waits) SIGKILLed together, before the leaker
    grows: nothing of umemc's userspace enforces until supervisord has restarted them, and the worker's own cgroup
    (its limit set by the exec wrapper at its start) holds the hard quota all the same: the kernel kills it at the
    limit, never past it."""
    r = stack(head("both", "max_kills = 100") + worker("leak", LEAK, 200, 2, 400, 10, memory="100MiB"))
    r.wait_for(lambda: r.events("enforcer_start"), what="the enforcer's start")
    for name in ("umemc-enforcer", "umemc-gateway"):
        os.kill(record(r.run_dir, name), signal.SIGKILL)
    kill = r.wait_for(lambda: r.events("hard_limit_kill", "leak"), timeout=60, what="the leaker killed")
    assert kill[0]["detail"]["by"] == "kernel"
    # what the leaker wrote of its private memory (RssAnon, what its cgroup is charged for) after each step
    grew = [int(x.split()[3]) for x in r.log_lines("leak") if x.startswith("rss ")]
    hard = 110 * 2**20  # 100 MiB x (1 + quota_headroom 0.1)
    assert grew and max(grew) <= hard


def test_unusable_event_log_degrades_to_stderr_and_enforcement_goes_on(stack, tmp_path: Path, run_cli, capsys) -> None:
    events = tmp_path / "run" / "state" / "events.db"
    events.mkdir(parents=True)  # not a database and never one: SQLite cannot open it
    r = stack(leaking_stack("evgone"))
    log = r.run_dir / "state" / "logs" / "umemc-enforcer.log"
    line = r.wait_for(
        lambda: next((x for x in log.read_text().splitlines() if '"kind": "hard_limit_kill"' in x), None),
        timeout=40,
        what="the kill in the enforcer's log",
    )
    assert json.loads(line.removeprefix("umemc events: "))["detail"]["by"] == "enforcer"
    capsys.readouterr()
    code, out, err = run_cli("status", "--run-dir", str(r.run_dir))
    assert code == 0
    assert err.startswith(
        "warning: event log: OperationalError: unable to open database file (events go to the "
        "enforcer's log meanwhile)\n"
    )
    code, out, err = run_cli("events", "--run-dir", str(r.run_dir))
    assert (code, out) == (2, "")
    assert err == (
        f"the event log {events} is unusable (OperationalError: unable to open database file); the "
        "runtime writes events to its logs in state/logs/ meanwhile\n"
    )


def test_exit_after_sigkill_reports_no_exit_status(stack) -> None:
    r = stack(
        head("sigkill", 'kernel_enforcement = "off"')
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
    )
    pid = r.status()["w"]["pid"]
    os.kill(pid, signal.SIGKILL)
    exits = r.wait_for(lambda: r.events("exit", "w"), what="the exit event")
    assert exits[0]["detail"]["pid"] == pid
    # said as it was, from supervisord's own log ("exited: w (terminated by SIGKILL; not expected)"), whether or
    # not a sample saw the worker down before supervisord restarted it
    assert exits[0]["detail"]["exitstatus"] is None
    assert (exits[0]["detail"]["cause"], exits[0]["detail"]["signal"]) == ("killed by SIGKILL, not by umemc", "SIGKILL")


def test_workers_never_see_the_gateway_token(stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMEMC_SEC_TOKEN", "t0ken-value")
    dump = tmp_path / "env.json"
    r = stack(
        head("tok")
        + f'[gateway]\nport = {free_port()}\ntoken_env = "UMEMC_SEC_TOKEN"\n'
        + worker("w", "envdump.py", "{port}", dump, memory="64MiB", port=free_port())
    )
    env = json.loads(dump.read_text())
    assert env["UMEMC_MODEL"] == "w" and "UMEMC_SEC_TOKEN" not in env
    sv = record(r.run_dir, "umemc-supervisord")
    assert b"UMEMC_SEC_TOKEN" not in Path(f"/proc/{sv}/environ").read_bytes()
    token = r.run_dir / "state" / "secrets" / "gateway-token"
    assert token.read_text() == "t0ken-value"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(r.run_dir.stat().st_mode) == stat.S_IMODE((r.run_dir / "state").stat().st_mode) == 0o700
    assert stat.S_IMODE((r.run_dir / "bundle").stat().st_mode) == 0o700


@needs_cgroups
def test_gateway_runs_in_its_own_budgeted_cgroup(stack) -> None:
    r = stack(
        head("gwcg")
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
        + f'[gateway]\nport = {free_port()}\nmemory = "300MiB"\n'
    )
    version, path, pid = (r.run_dir / "state" / "cgroups" / "umemc-gateway").read_text().split()
    assert int(pid) == record(r.run_dir, "umemc-gateway")
    assert int(pid) in [int(p) for p in (Path(path) / "cgroup.procs").read_text().split()]
    limit = "memory.max" if version == "2" else "memory.limit_in_bytes"
    assert int((Path(path) / limit).read_text()) == 300 * MiB


def test_a_models_python_variables_cannot_switch_off_its_wrapper(stack, tmp_path: Path) -> None:
    """A model's PYTHONPATH pointing at a shadow umemc (whose wrap.py would exec without records or cgroup) and
    a PYTHONHOME meant for another interpreter: the wrapper runs isolated (-I) and never reads them; the
    worker, exec'd after, gets them under their own names."""
    shadow = tmp_path / "shadow" / "umemc" / "runtime"
    shadow.mkdir(parents=True)
    for init in (shadow / "__init__.py", shadow.parent / "__init__.py"):
        init.write_text("")
    (shadow / "wrap.py").write_text(
        "import os, sys\nargv = sys.argv[sys.argv.index('--') + 1:]\nos.execvp(argv[0], argv)\n"
    )
    dump = tmp_path / "env.json"
    r = stack(
        head("pyenv")
        + worker("w", "envdump.py", "{port}", dump, memory="64MiB", port=free_port())
        + f'[models.w.env]\nPYTHONPATH = "{tmp_path / "shadow"}"\nPYTHONDONTWRITEBYTECODE = "1"\n'
    )
    env = json.loads(dump.read_text())
    assert env["PYTHONPATH"] == str(tmp_path / "shadow") and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert not [k for k in env if k.startswith("UMEMC_ENV_")]
    pid = record(r.run_dir, "w")  # the real wrapper recorded it; the shadow would not have
    assert alive(pid)
    if detect("probe")[0] is not None:
        assert (r.run_dir / "state" / "cgroups" / "w").exists()


def test_the_wrapper_ignores_a_broken_pythonhome(tmp_path: Path) -> None:
    """PYTHONHOME pointing nowhere breaks a plain interpreter at start-up; the isolated wrapper does not read it
    (the exec'd program here is not Python, so it runs)."""
    import subprocess
    import sys

    from umemc.names import WRAP_ENTRY

    out = tmp_path / "ok"
    env = dict(os.environ, UMEMC_ENV_PYTHONHOME="/nonexistent", PYTHONHOME="/nonexistent")
    argv = [sys.executable, "-I", "-S", WRAP_ENTRY, "--stack", "s", "--model", "m", "--hard", "0"]  # as compiled
    argv += ["--soft", "0", "--cgroup", "off", "--state", str(tmp_path / "state"), "--outlive-parent", "--"]
    argv += ["/bin/sh", "-c", f'printf %s "$PYTHONHOME" > {out}']
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "/nonexistent"
    assert (tmp_path / "state" / "pids" / "m").exists()


@pytest.mark.parametrize("which", ["run dir", "state dir"])
def test_up_refuses_a_symlinked_run_dir_before_touching_it(tmp_path: Path, capsys, which: str) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    (target / "keep.txt").write_text("mine")
    run = tmp_path / "run"
    if which == "run dir":
        run.symlink_to(target)
        link = run
    else:
        run.mkdir()
        (run / "state").symlink_to(target)
        link = run / "state"
    stack = tmp_path / "stack.toml"
    stack.write_text(head("sym") + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port()))
    assert main(["up", str(stack), "--run-dir", str(run), "--simulate"]) == 2
    assert capsys.readouterr().err == (
        f"{link} is a symlink (to {target}): umemc writes its state, secrets and logs only into a directory of "
        "its own; give --run-dir the real path\n"
    )
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


@pytest.fixture
def small_tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 48 MiB tmpfs of its own (the machine's disk is never filled); skipped where mounting is not allowed."""
    import subprocess

    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.slow
def test_a_full_state_dir_does_not_take_the_stack_down(small_tmpfs: Path, capsys) -> None:
    """The run dir on a small tmpfs, filled to the last byte, then kill -9 of one worker: supervisord cannot
    write a log line, but it supervises on (its log lines are dropped, not fatal), restarts the worker, and
    `down` stops everything while the disk is still full."""
    from tests.runtime.conftest import bring_down, bring_up

    r = bring_up(
        small_tmpfs,
        head("full")
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
        + worker("s", "steady.py", "{port}", 5, memory="64MiB", port=free_port()),
    )
    try:
        r.wait_for(lambda: {m["state"] for m in r.status().values()} == {"RUNNING"}, timeout=30, what="RUNNING")
        before = {n: m["pid"] for n, m in r.status().items()}
        supervisord = record(r.run_dir, "umemc-supervisord")
        with open(small_tmpfs / "fill", "wb") as f:  # every last block
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
        # tmpfs gives out whole pages: a log whose last page has room would still take a line. Fill every
        # log's last page too, so the next line supervisord writes (its own, or a traceback) finds no room.
        for log in [*r.run_dir.joinpath("state").glob("*.log"), *r.run_dir.joinpath("state/logs").glob("*")]:
            with contextlib.suppress(OSError), open(log, "ab") as f:
                f.write(b"\0" * (-f.tell() % 4096))
        os.kill(before["w"], signal.SIGKILL)
        r.wait_for(
            lambda: r.status()["w"]["pid"] not in (None, before["w"]) and r.status()["w"]["state"] == "RUNNING",
            timeout=30,
            what="the restart of w on a full disk",
        )
        assert alive(supervisord) and r.status()["s"]["pid"] == before["s"]
        assert main(["status", "--run-dir", str(r.run_dir)]) == 0
    finally:
        capsys.readouterr()
        bring_down(r)  # while the disk is still full: down stops everything, records and cgroups included


def test_a_read_only_state_dir_never_blocks_a_restart(stack, tmp_path: Path) -> None:
    """The state dir made read-only (a read-only bind mount over it), then kill -9 of a worker: supervisord cannot
    open the worker's log files (EROFS) and used to leave it FATAL, so its model answered 503 until the dir was
    writable again. Now it starts with its output dropped, and serves."""
    import http.client
    import subprocess

    port = free_port()
    r = stack(head("ro") + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=port))
    state = r.run_dir / "state"
    before = r.status()["w"]["pid"]
    bound = subprocess.run(["mount", "--bind", str(state), str(state)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()}")
    try:
        done = subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], capture_output=True)
        assert done.returncode == 0, done.stderr
        os.kill(before, signal.SIGKILL)
        r.wait_for(
            lambda: r.status()["w"]["pid"] not in (None, before) and r.status()["w"]["state"] == "RUNNING",
            what="the restart of w on a read-only state dir",
        )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=patience(10))
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_without_cgroups_down_and_the_enforcer_find_a_double_forked_daemon(stack, tmp_path: Path, capsys) -> None:
    """kernel_enforcement = "off": no cgroup knows the worker's setsid grandchild. It still carries the run's
    mark (UMEMC_RUN, UMEMC_MODEL from the exec wrapper): the enforcer counts its memory against the worker's
    quota (and kills it with the worker), and `down` finds and kills it."""
    pidfile = tmp_path / "grandchild.pid"
    r = stack(
        head("nocg", 'kernel_enforcement = "off"\nquota_headroom = 0.1')
        + worker("w", "forker.py", "{port}", pidfile, 0, memory="100MiB", port=free_port())
        + worker("x", "forker.py", "{port}", tmp_path / "big.pid", 200, memory="100MiB", port=free_port())
    )
    small = int(r.wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="w's grandchild"))
    # x's grandchild holds 200 MiB against x's 110 MiB hard quota: found within the escape sweep, killed with x
    kill = r.wait_for(
        lambda: [e for e in r.events("hard_limit_kill") if e["model"] == "x"], timeout=30, what="x's kill"
    )
    assert kill[0]["detail"]["usage_bytes"] > 110 * MiB
    big = int((tmp_path / "big.pid").read_text()) if (tmp_path / "big.pid").exists() else None
    if big is not None:
        r.wait_for(lambda: not alive(big) or int((tmp_path / "big.pid").read_text()) != big, what="x's daemon gone")
    assert alive(small)
    capsys.readouterr()
    assert main(["down", "--run-dir", str(r.run_dir)]) == 0
    assert not alive(small)


def test_down_returns_only_once_every_daemon_of_the_stack_is_gone(stack, tmp_path: Path, capsys) -> None:
    """kernel_enforcement = "off" and a worker that makes a daemon every 20 ms: one born between `down`'s scan and
    its kill used to outlive `down`, which said 0. Every pass kills what the last one missed; `down` returns 0
    only when no process carrying the run's mark is left."""
    from umemc.runtime.probes.host import marked_processes

    r = stack(
        head("spawn", 'kernel_enforcement = "off"')
        + worker("w", "spawner.py", "{port}", memory="200MiB", port=free_port())
    )
    from umemc.runtime.control import Stack
    from umemc.runtime.rundir import RunDir

    mark = Stack(RunDir(r.run_dir)).members.mark
    r.wait_for(lambda: len(marked_processes(mark)) > 5, what="the daemons")
    capsys.readouterr()
    assert main(["down", "--run-dir", str(r.run_dir)]) == 0
    assert marked_processes(mark) == []


def test_down_never_kills_what_a_forged_record_names(stack, tmp_path: Path, capsys) -> None:
    """A record copied from another stack's run dir names a real process with the right start time: `down`
    checks the run's mark before it kills, says so, and leaves the other stack running."""
    from tests.runtime.conftest import bring_down, bring_up

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = bring_up(
        tmp_path / "a", head("forged-a") + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
    )
    b = bring_up(
        tmp_path / "b", head("forged-b") + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
    )
    try:
        victim = record(b.run_dir, "w")
        for folder in ("pids", "cgroups"):
            src = b.run_dir / "state" / folder / "w"
            if src.exists():
                (a.run_dir / "state" / folder / "intruder").write_text(src.read_text())
        capsys.readouterr()
        assert main(["down", "--run-dir", str(a.run_dir)]) == 0
        out = capsys.readouterr().out
        assert (
            f"down: record intruder: pid {victim} is not a process of this run (copied from another run, or forged): "
            "not killed, record removed\n" in out
        )
        assert alive(victim) and b.status()["w"]["state"] == "RUNNING"
        assert not (a.run_dir / "state" / "pids" / "intruder").exists()
    finally:
        bring_down(b)
        if (a.run_dir / "state").exists():
            main(["down", "--run-dir", str(a.run_dir)])


@pytest.mark.parametrize("enforcement", ["auto", "off"])
def test_a_read_only_state_dir_does_not_block_a_restart(stack, tmp_path: Path, enforcement: str) -> None:
    """state/pids and state/cgroups made read-only (bind mounts), a stale cgroup record in the way: the exec
    wrapper cannot write or remove a worker's records, says so, and starts it anyway; supervisord restarts a
    killed worker as before."""
    import subprocess

    policy = f'kernel_enforcement = "{enforcement}"'
    r = stack(head("rostate", policy) + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port()))
    r.wait_for(lambda: r.status()["w"]["state"] == "RUNNING", timeout=30, what="RUNNING")
    stale = r.run_dir / "state" / "cgroups" / "w"
    if not stale.exists():
        stale.parent.mkdir(mode=0o700, exist_ok=True)
        stale.write_text("2 /nonexistent 1\n")  # what a crashed run with cgroups would have left
    mounted = []
    try:
        for folder in ("pids", "cgroups"):
            d = str(r.run_dir / "state" / folder)
            if subprocess.run(["mount", "--bind", d, d], capture_output=True).returncode != 0:
                pytest.skip("cannot bind-mount here")
            mounted.append(d)
            subprocess.run(["mount", "-o", "remount,bind,ro", d], check=True)
        before = r.status()["w"]["pid"]
        os.kill(before, signal.SIGKILL)
        r.wait_for(
            lambda: r.status()["w"]["pid"] not in (None, before)
            and r.status()["w"]["state"] in ("STARTING", "RUNNING"),
            timeout=30,
            what="the restart with read-only records",
        )
        log = r.run_dir / "state" / "logs" / "w.err.log"
        err = r.wait_for(lambda: log.read_text().count("steady: ready") == 2 and log.read_text(), what="w ready again")
        assert f"umemc-wrap: cannot record {r.run_dir}/state/pids/w: Read-only file system; starting anyway" in err
        r.wait_for(lambda: r.status()["w"]["state"] == "RUNNING", timeout=30, what="RUNNING again")
    finally:
        for d in reversed(mounted):
            subprocess.run(["umount", d], check=False)


def test_a_deleted_event_log_is_said_and_started_anew(stack, capsys) -> None:
    """events.db deleted under a running stack: `status` says the log is missing; the next event (a cold start
    through the gateway) reopens it with an event_log_reset first, so nothing after the deletion is lost."""
    from tests.runtime.test_gateway import Gateway, model, stack_text

    gw = Gateway(stack(stack_text("evdel", model("c"), slots=2), "--simulate"))
    events = gw.run.run_dir / "state" / "events.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{events}{suffix}").unlink(missing_ok=True)
    capsys.readouterr()
    assert main(["status", "--run-dir", str(gw.run.run_dir)]) == 0
    assert (
        f"event log: {events} is missing (deleted?); the runtime starts a new one with its next event"
        in capsys.readouterr().err
    )
    assert gw.complete("c")[0] == 200
    kinds = [e["kind"] for e in gw.run.events()]
    assert kinds[:1] == ["event_log_reset"] and "cold_start" in kinds
    reset = gw.run.events("event_log_reset")[0]["detail"]
    assert reset == {"reason": f"{events} was deleted or replaced while in use"}


@needs_cgroups
def test_status_shows_what_ps_shows_and_the_charge_its_quota_is_held_to(stack, tmp_path: Path, run_cli, capsys) -> None:
    """A worker maps a 96 MiB file this test read first (its pages are in the page cache, charged to this test's
    cgroup): the worker's cgroup is charged for little of it, `ps` counts all of it. status's RSS is the tree's
    resident memory as psutil reads it; rss_bytes (what the quota is held to) is the charge, the lower."""
    data = tmp_path / "weights.bin"
    data.write_bytes(os.urandom(96 * MiB))
    data.read_bytes()  # cached here first
    port = free_port()
    r = stack(head("mapped") + worker("m", "mapper.py", "{port}", str(data), memory="256MiB", port=port))
    pid = r.status()["m"]["pid"]
    lines = r.wait_for(lambda: "mapped and read" in "".join(r.log_lines("m")) and r.log_lines("m"), what="the map")
    assert lines
    capsys.readouterr()  # what up said

    def both() -> tuple[int, int, int] | None:
        code, out, _ = run_cli("status", "--run-dir", str(r.run_dir), "--json")
        m = json.loads(out)["models"]["m"]
        tree = psutil.Process(pid)
        ps = sum(p.memory_info().rss for p in [tree, *tree.children(recursive=True)])
        ok = m["resident_bytes"] is not None and abs(m["resident_bytes"] - ps) < 8 * MiB
        return (m["resident_bytes"], m["rss_bytes"], ps) if ok and m["resident_bytes"] >= 96 * MiB else None

    resident, charged, _ = r.wait_for(both, what="status to show the mapped file as ps does")
    assert charged < resident - 64 * MiB, (charged, resident)
