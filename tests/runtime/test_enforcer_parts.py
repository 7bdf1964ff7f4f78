"""The enforcer's parts on their own: the quota rules are pure functions of numbers (expected values by
hand), and a worker's phase moves only along its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from umemc.runtime.enforcer import rules
from umemc.runtime.enforcer.worker_state import TRANSITIONS, IllegalTransition, Phase, Quota, Worker

MiB = 1024 * 1024
RESTARTED = "restarted before it was sampled"


def test_soft_quota_is_reported_once_per_crossing_and_rearmed_below_95_percent() -> None:
    soft = 100 * MiB
    assert rules.soft_crossing(100 * MiB, soft, raised=False) is None  # at the quota: not over it
    assert rules.soft_crossing(100 * MiB + 1, soft, raised=False) is True
    assert rules.soft_crossing(200 * MiB, soft, raised=True) is None  # still over: said once
    assert rules.soft_crossing(96 * MiB, soft, raised=True) is None  # 96% > 95%: not re-armed
    assert rules.soft_crossing(94 * MiB, soft, raised=True) is False


def test_give_up_counts_only_kills_within_the_window() -> None:
    kills = [0.0, 50.0, 100.0]
    assert rules.give_up_due(kills, now=100.0, window_s=60.0, max_kills=3) is None  # 0.0 is 100 s old
    assert rules.give_up_due(kills, now=100.0, window_s=100.0, max_kills=3) == 3
    assert rules.give_up_due(kills, now=100.0, window_s=60.0, max_kills=2) == 2


def test_leak_is_a_steady_climb_over_the_threshold() -> None:
    # 1 MiB/s for 60 s = 60 MiB/min; 400 MiB used of 1000: (1000 - 400) MiB / 1 MiB/s = 600 s to the hard quota
    samples = [(float(t), 100 * MiB + t * MiB) for t in range(61)]
    detail = rules.leak(samples, 60.0, 50 * MiB, 400 * MiB, 1000 * MiB)
    assert detail == {
        "bytes_per_min": 60 * MiB,
        "window_s": 60.0,
        "usage_bytes": 400 * MiB,
        "hard_bytes": 1000 * MiB,
        "seconds_to_hard": 600.0,
    }
    assert rules.leak(samples, 60.0, 60 * MiB, 400 * MiB, 1000 * MiB) is None  # not above the threshold
    saw = [(float(t), 100 * MiB + (t % 2) * 200 * MiB + t * MiB) for t in range(61)]  # R² 0.03: noise, not a leak
    assert rules.leak(saw, 60.0, 10 * MiB, 400 * MiB, 1000 * MiB) is None


def test_leak_rate_needs_ten_seconds_of_the_last_minute() -> None:
    assert rules.leak_rate([(0.0, 0), (5.0, 500), (9.0, 900)]) is None
    assert rules.leak_rate([(0.0, 0), (5.0, 500), (10.0, 1000)]) == 100.0
    # only the last 60 s count: the flat first minute is left out
    flat_then_climb = [(float(t), 0) for t in range(0, 60, 10)] + [(100.0 + t, 10 * t) for t in range(0, 61, 10)]
    assert rules.leak_rate(flat_then_climb) == 10.0


def test_buffers_drift_is_reported_only_over_five_percent() -> None:
    report = {"model": 600, "kv": 300, "compute": 100, "output": 50}  # 1050 against 1000 planned: exactly +5%
    assert rules.buffers_drift(report, 1000) == {}
    report["output"] = 51
    assert rules.buffers_drift(report, 1000) == {
        "buffers_bytes": 1051,
        "buffers_planned_bytes": 1000,
        "buffers_over": 0.051,
        "buffers": report,
    }


@pytest.mark.parametrize(
    ("info", "new_pid", "want"),
    [
        (None, None, {"exitstatus": None, "cause": "unknown"}),
        ({"statename": "EXITED", "exitstatus": 3}, 42, {"exitstatus": None, "cause": RESTARTED}),
        ({"statename": "EXITED", "exitstatus": -1}, None, {"exitstatus": None, "cause": "killed by a signal"}),
        ({"statename": "STOPPED", "exitstatus": 0}, None, {"exitstatus": 0, "cause": "stopped"}),
        # evicted, and it died of SIGTERM's default action (supervisord reads -1): a stop, never a restart
        ({"statename": "STOPPED", "exitstatus": -1}, None, {"exitstatus": None, "cause": "stopped"}),
        ({"statename": "EXITED", "exitstatus": 3}, None, {"exitstatus": 3, "cause": "exited"}),
        ({"statename": "BACKOFF", "exitstatus": 0}, None, {"exitstatus": None, "cause": "unknown"}),
        ({"statename": "STOPPING", "exitstatus": 0}, None, {"exitstatus": None, "cause": "stopped"}),
    ],
)
def test_exit_cause(info: dict[str, object] | None, new_pid: int | None, want: dict[str, object]) -> None:
    assert rules.exit_cause(info, new_pid) == want


def test_a_worker_moves_only_along_its_table() -> None:
    w = Worker(Quota("w", 2 * MiB, MiB, 50, MiB))
    assert w.phase is Phase.DOWN
    with pytest.raises(IllegalTransition, match=r"^w: down -> killed$"):
        w.to(Phase.KILLED)
    w.began(100, now=1.0)
    assert (w.phase, w.pid, w.started) == (Phase.UP, 100, 1.0)
    w.to(Phase.OOM_KILLED)
    w.to(Phase.GIVEN_UP)
    assert w.given_up
    with pytest.raises(IllegalTransition, match=r"^w: given_up -> down$"):
        w.to(Phase.DOWN)  # left stopped until someone starts it again
    w.began(101, now=2.0)
    assert w.phase is Phase.UP and not w.given_up
    # every phase can be left, and every phase but DOWN is reached from somewhere
    assert all(TRANSITIONS[p] for p in Phase)
    assert {q for targets in TRANSITIONS.values() for q in targets} == set(Phase)


def test_a_new_process_forgets_what_was_measured_of_the_last() -> None:
    w = Worker(Quota("w", 2 * MiB, MiB, 50, MiB))
    w.began(100, now=1.0)
    w.cpu_side, w.gpu_side, w.peak, w.drift = MiB, 10, MiB + 10, 0.2
    w.samples.append((1.0, MiB))
    w.kills.append(1.5)
    w.forget()
    assert (w.pid, w.usage, w.peak, w.drift, list(w.samples)) == (None, 0, 0, None, [])
    assert list(w.kills) == [1.5]  # kills count across restarts (max_kills within kill_window)


def test_a_six_hour_leak_window_is_spanned_and_fires() -> None:
    """The 1 Hz ring used to hold an hour: leak_window = "6h" was accepted and never fired. The series keeps one
    point every window / 1800 s, so six hours fit in 1,802 points and a slow steady leak (2 MiB/min, over a
    threshold of 1 MiB/min) is reported once the window is full."""
    from umemc.runtime.enforcer.series import Series

    window = 6 * 3600.0
    series = Series(window)
    assert series.period == 12.0
    for t in range(0, 7 * 3600):  # the enforcer's 1 Hz bookkeeping for seven hours
        series.add(float(t), 100 * MiB + t * 2 * MiB // 60)
        if t == 5 * 3600:
            assert not series.spans_window()  # five hours in: not yet
    assert series.spans_window() and len(series) <= 1802
    points = series.points()
    assert points[-1][0] - points[0][0] < window + series.period  # no more than the window (and one period)
    detail = rules.leak(points, window, 1 * MiB, points[-1][1], 2000 * MiB)
    assert detail is not None and detail["bytes_per_min"] == pytest.approx(2 * MiB, rel=0.001)


def test_a_short_window_keeps_one_point_a_second() -> None:
    from umemc.runtime.enforcer.series import Series

    series = Series(300.0)
    for t in range(400):
        series.add(float(t), t)
    assert series.period == 1.0 and [p[0] for p in series.points()][:2] == [99.0, 100.0]


def test_box_and_own_trends_and_the_time_to_exhaustion() -> None:
    # the box's used memory grows 1 MiB/s with 3600 MiB available: exhausted in 3600 s; umemc itself is flat
    from umemc.runtime.enforcer.series import Series

    box, own = Series(300.0), Series(300.0)
    for t in range(120):
        box.add(float(t), 1000 * MiB + t * MiB)
        own.add(float(t), 80 * MiB)
    assert rules.box_trends(box, own, 3600 * MiB) == {
        "own_bytes": 80 * MiB,
        "box_trend_bytes_per_s": float(MiB),
        "own_trend_bytes_per_s": 0.0,
        "exhaustion_s": 3600.0,
    }
    assert rules.box_trends(Series(300.0), Series(300.0), None) == {
        "own_bytes": None, "box_trend_bytes_per_s": None, "own_trend_bytes_per_s": None, "exhaustion_s": None,
    }  # fmt: skip


def test_the_enforcer_lock_is_taken_whatever_stands_at_its_path(tmp_path: Path) -> None:
    """A directory, or a link (here to a file outside the state dir), at state/enforcer.lock: removed, never
    followed, and the lock taken; the link's target is untouched."""
    import fcntl
    import os

    from umemc.runtime.enforcer import _lock_file

    outside = tmp_path / "outside"
    outside.write_text("keep me\n")
    for plant in ("dir", "link"):
        lock = tmp_path / f"{plant}.lock"
        if plant == "dir":
            (lock / "inside").mkdir(parents=True)
        else:
            lock.symlink_to(outside)
        fd = _lock_file(lock)
        assert fd is not None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert lock.is_file() and not lock.is_symlink()
        finally:
            os.close(fd)
    assert outside.read_text() == "keep me\n"


def test_supervisords_log_says_how_a_process_ended() -> None:
    """supervisor 4's own lines (supervisor/process.py: spawned, exited with decode_wait_status's words), for the
    pid asked about: an earlier run's end is never taken for it."""
    from umemc.runtime.enforcer.rules import logged_exit

    log = (
        "2026-12-06 22:19:34,848 INFO spawned: 'w' with pid 100\n"
        "2026-12-06 22:19:40,001 WARN exited: w (exit status 1; not expected)\n"
        "2026-12-06 22:19:41,002 INFO spawned: 'w' with pid 101\n"
        "2026-12-06 22:19:42,003 INFO success: w entered RUNNING state, process has stayed up for > than 1 seconds\n"
        "2026-12-06 22:19:50,004 WARN exited: w (terminated by SIGKILL; not expected)\n"
        "2026-12-06 22:19:51,005 INFO spawned: 'w' with pid 102\n"
    )
    assert logged_exit(log, "w", 100) == {"exitstatus": 1, "cause": "exited"}
    assert logged_exit(log, "w", 101) == {
        "exitstatus": None,
        "signal": "SIGKILL",
        "cause": "killed by SIGKILL, not by umemc",
    }
    assert logged_exit(log, "w", 102) is None  # still running
    assert logged_exit(log, "other", 100) is None


def test_a_process_without_openssl_hashes_and_speaks_http_over_a_socket() -> None:
    """supervisord and the enforcers call without_openssl first: ssl is refused (http.client then has no HTTPS, and
    XML-RPC over supervisord's unix socket needs none), hashlib falls back to Python's own hashes."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom umemc.runtime import without_openssl\nwithout_openssl()\nimport hashlib, http.client\n"
        "print(sys.modules['ssl'], hashlib.sha256(b'x').hexdigest()[:16], hasattr(http.client, 'HTTPSConnection'),"
        " '_hashlib' in sys.modules and sys.modules['_hashlib'])"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout == "None 2d711642b726b044 False None\n"


def test_without_openssl_leaves_what_a_process_already_loaded() -> None:
    import hashlib
    import ssl
    import sys

    from umemc.runtime import without_openssl

    without_openssl()
    assert sys.modules["ssl"] is ssl and ssl.OPENSSL_VERSION
    assert hashlib.sha256(b"x").hexdigest() == "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"


def test_an_enforcer_process_waiting_for_the_lock_says_so_and_takes_it_back_once_it_holds_it(tmp_path: Path) -> None:
    """An enforcer process that finds the lock held writes `pid starttime` to the ready record while it waits (what
    the standby in the gateway's process hands the lock back on) and removes it once it holds the lock; a record
    naming a process gone, or this very process, is no waiting enforcer."""
    import fcntl
    import os
    import subprocess
    import sys

    from umemc.records import pid_line, write_atomic
    from umemc.runtime.enforcer import _lock_file, waits
    from umemc.runtime.probes.host import start_time

    lock, ready = tmp_path / "enforcer.lock", tmp_path / "enforcer.ready"
    held = _lock_file(lock)
    assert held is not None
    fcntl.flock(held, fcntl.LOCK_EX)
    code = (
        "import sys; from pathlib import Path; from umemc.runtime.enforcer import _take_over\n"
        f"_take_over(Path({str(lock)!r}), 0.0, ready=Path({str(ready)!r})); print('holds it', flush=True)\n"
        "sys.stdin.read()\n"
    )
    waiter = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert waiter.stdin is not None and waiter.stdout is not None and waiter.stderr is not None
    try:  # it says it waits once its record is written
        assert waiter.stderr.readline() == "umemc-enforcer: standby: another enforcer runs; taking over when it stops\n"
        assert waits(ready)
        assert ready.read_text() == pid_line(waiter.pid, start_time(waiter.pid))
        os.close(held)  # released: the waiter takes the lock, and its record goes
        assert waiter.stdout.readline() == "holds it\n"
        assert waiter.stderr.readline() == "umemc-enforcer: the enforcer that ran stopped: enforcing\n"
        assert not ready.exists() and not waits(ready)
    finally:
        waiter.stdin.close()
        waiter.wait()
    write_atomic(ready, pid_line(waiter.pid, start_time(os.getpid())))  # gone since
    assert not waits(ready)
    write_atomic(ready, pid_line(os.getpid(), start_time(os.getpid())))  # this process: not another enforcer
    assert not waits(ready)


def test_the_standby_in_the_gateways_process_outlives_a_failing_enforcer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An enforcer that cannot be built (here: no plan) or fails is said on the gateway's stderr and built afresh
    a second later; the gateway's process goes on (the standby is a daemon thread of it)."""
    from umemc.runtime.enforcer import Standby

    paused: list[float] = []

    def pause(seconds: float) -> None:
        paused.append(seconds)
        if len(paused) == 2:
            standby.on_hup()  # with no enforcer built: nothing to tell
            standby.stop()

    standby = Standby(tmp_path / "bundle", pause=pause)
    assert standby.thread.daemon
    standby.start().thread.join(30)
    assert not standby.thread.is_alive()
    plan = tmp_path / "bundle" / "plan.json"
    said = f"umemc-gateway: standby enforcer: ContractError: {plan}: cannot read: No such file or directory\n"
    assert paused == [1.0, 1.0] and capsys.readouterr().err == said * 2


def standby_bundle(tmp_path: Path) -> Path:
    """A real bundle of a one-worker stack (the enforcer loop tests' own), with its run's state dir."""
    from tests.runtime.test_enforcer_loop import STACK
    from umemc.budget.plan import make_plan
    from umemc.commands.build import build
    from umemc.stack.resolve import load_stack

    (tmp_path / "stack.toml").write_text(STACK.format(policy='sample_interval = "100ms"\n'))
    bundle = tmp_path / "run" / "bundle"
    build(make_plan(load_stack(tmp_path / "stack.toml")), bundle, files_later=True)
    (tmp_path / "run" / "state").mkdir(parents=True)
    return bundle


class Said:
    """What the gateway's standby says on stderr (captured), line by line, as it says it."""

    WHO = "umemc-gateway: standby enforcer: "
    WAITING = WHO + "standby: another enforcer runs; taking over when it stops"
    ENFORCING = WHO + "the enforcer that ran stopped: enforcing"
    HANDED = WHO + "the enforcer process waits: handed the lock back"

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.lines: list[str] = []

    def until(self, lines: list[str], what: str) -> None:
        from tests.runtime.conftest import wait_for

        def heard() -> bool:
            self.lines.extend(x for x in self.capsys.readouterr().err.splitlines() if x.startswith(self.WHO))
            return self.lines == lines

        try:
            wait_for(heard, what=what, every=0.02)
        except AssertionError:
            raise AssertionError(f"{what}: {self.lines}") from None


def test_the_standby_in_the_gateways_process_takes_over_enforces_and_hands_the_lock_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The standby thread of a real bundle (no supervisord here: its ticks say so and go on): while another holds
    the run's enforcer lock it waits, with no event log open (none created); once that one lets go it enforces
    (its enforcer_start names this process); once an enforcer process says it waits (the ready record, naming a
    live process) it hands the lock back within a second and waits again."""
    import fcntl
    import os
    import subprocess
    import sys

    from tests.runtime.conftest import wait_for
    from umemc.records import pid_line, write_atomic
    from umemc.runtime.enforcer import Standby, _lock_file
    from umemc.runtime.event_log import EventLog
    from umemc.runtime.probes.host import start_time
    from umemc.runtime.rundir import RunDir

    bundle = standby_bundle(tmp_path)
    run = RunDir.of_bundle(bundle)
    held = _lock_file(run.enforcer_lock)
    assert held is not None
    fcntl.flock(held, fcntl.LOCK_EX)  # the enforcer process enforces
    said = Said(capsys)
    standby = Standby(bundle).start()
    waiter = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        said.until([Said.WAITING], "the standby waiting")
        assert not run.events.exists()  # until it enforces: a log deleted under the running stack stays deleted
        os.close(held)  # the enforcer process died: the kernel let go of its lock
        said.until([Said.WAITING, Said.ENFORCING], "the standby enforcing")
        log = EventLog(run.events)
        try:  # said as it took the lock; its enforcer_start follows
            starts = wait_for(
                lambda: [e.detail["pid"] for e in log.since(0) if e.kind == "enforcer_start"],
                what="its enforcer_start",
                every=0.02,
            )
            assert starts == [os.getpid()]
        finally:
            log.close()
        write_atomic(run.enforcer_ready, pid_line(waiter.pid, start_time(waiter.pid)))  # a restarted one waits
        said.until([Said.WAITING, Said.ENFORCING, Said.HANDED], "the lock handed back")
        again = _lock_file(run.enforcer_lock)  # the restarted enforcer takes it
        assert again is not None
        fcntl.flock(held := again, fcntl.LOCK_EX)
        said.until([Said.WAITING, Said.ENFORCING, Said.HANDED, Said.WAITING], "the standby waiting again")
    finally:
        assert waiter.stdin is not None
        waiter.stdin.close()
        waiter.wait()
        standby.stop()
        os.close(held)  # it takes the lock, sees it is stopped and ends
        standby.thread.join(30)
    assert not standby.thread.is_alive()
